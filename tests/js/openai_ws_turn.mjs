// The unmodified `openai` npm client (OpenAIRealtimeWS) against the gateway over wss://, trusting the
// gateway's own CA through NODE_EXTRA_CA_CERTS: one turn answered in full, then one cancelled.
// Usage: node openai_ws_turn.mjs https://localhost:PORT/v1 speech.pcm   (pcm16 24 kHz mono)
// Prints one JSON line: what happened, for tests/interop/test_js_clients.py to check.
import fs from "node:fs";
import OpenAI from "openai";
import { OpenAIRealtimeWS } from "openai/realtime/ws";

const [baseURL, pcmPath] = process.argv.slice(2);
const speech = fs.readFileSync(pcmPath);
const silence = Buffer.alloc(48 * 1000);
const client = new OpenAI({ apiKey: process.env.OPENAI_API_KEY, baseURL });
const rt = new OpenAIRealtimeWS({ model: "gpt-realtime" }, client);
const result = { url: rt.url?.toString(), events: {}, responses: [], errors: [] };
const seen = [];
const waiters = [];

function next(type, match = () => true) {
  const found = seen.find((e) => e.type === type && match(e));
  if (found) return Promise.resolve(found);
  return new Promise((resolve) => waiters.push({ type, match, resolve }));
}

rt.on("event", (event) => {
  result.events[event.type] = (result.events[event.type] ?? 0) + 1;
  seen.push(event);
  for (const w of [...waiters]) {
    if (w.type === event.type && w.match(event)) {
      waiters.splice(waiters.indexOf(w), 1);
      w.resolve(event);
    }
  }
});
rt.on("error", (err) => result.errors.push(String(err?.message ?? err)));

function append(pcm) {
  for (let i = 0; i < pcm.length; i += 4800) {
    rt.send({ type: "input_audio_buffer.append", audio: pcm.subarray(i, i + 4800).toString("base64") });
  }
}

const timeout = setTimeout(() => {
  result.errors.push("timed out");
  console.log(JSON.stringify(result));
  process.exit(1);
}, 30_000);

await next("session.created");
rt.send({ type: "session.update", session: { type: "realtime", audio: { input: { turn_detection: null } } } });
await next("session.updated");

// Turn 1: the whole reply.
append(speech);
rt.send({ type: "input_audio_buffer.commit" });
rt.send({ type: "response.create" });
const first = await next("response.done");
result.responses.push({ status: first.response.status });

// Turn 2: cancelled as soon as its first audio arrives.
append(Buffer.concat([speech, silence]));
rt.send({ type: "input_audio_buffer.commit" });
rt.send({ type: "response.create" });
const created = await next("response.created", (e) => e.response.id !== first.response.id);
await next("response.output_audio.delta", (e) => e.response_id === created.response.id);
rt.send({ type: "response.cancel" });
const second = await next("response.done", (e) => e.response.id === created.response.id);
result.responses.push({ status: second.response.status, reason: second.response.status_details?.reason });

clearTimeout(timeout);
rt.close();
console.log(JSON.stringify(result));
