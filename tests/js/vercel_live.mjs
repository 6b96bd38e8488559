// The Vercel AI SDK's OpenAI Live model (@ai-sdk/openai, experimental_realtime(model, {api: "live"})) over a
// WebSocket from Node, as an app drives it: session-start, 100 ms of pcm16 24 kHz every 100 ms (speech, then
// silence), the delegation answered with a commentary append, session-close. Every server event goes through the
// SDK's own parser (strict: a malformed one throws). Prints one JSON line: what it saw.
// Usage: node vercel_live.mjs <base URL, .../v1> <speech.pcm> (OPENAI_API_KEY in the environment)
import { readFileSync } from "node:fs";
import { createOpenAI } from "@ai-sdk/openai";
import WebSocket from "ws";

const [baseURL, speechPath] = process.argv.slice(2);
const openai = createOpenAI({ apiKey: process.env.OPENAI_API_KEY, baseURL });
const model = openai.experimental_realtime("gpt-live-1", { api: "live" });
const { url, headers } = await model.getServerWebSocketConfig();
const parse = model.createServerEventParser();
const speech = readFileSync(speechPath);
const result = { url, started: null, audioChunks: 0, speechChunks: 0, user: "", assistant: "", delegations: [],
                 acknowledged: [], errors: [], closed: null };
const ws = new WebSocket(url, { headers });
const send = (event) => ws.send(JSON.stringify(model.serializeClientEvent(event)));
let timer = null;
let answered = false;

ws.on("open", () => send({ type: "session-start", eventId: "start",
                           config: { instructions: "Delegate checks to the client.", voice: "marin" } }));
ws.on("message", (data) => {
  for (const event of parse(JSON.parse(data.toString()))) {
    switch (event.type) {
      case "session-started": {
        result.started = { sessionId: event.sessionId, delegationMode: event.delegationMode };
        let offset = 0;
        timer = setInterval(() => {
          const frame = Buffer.alloc(4800);
          if (offset < speech.length) speech.copy(frame, 0, offset, Math.min(offset + 4800, speech.length));
          offset += 4800;
          send({ type: "input-audio-append", audio: frame.toString("base64") });
        }, 100);
        break;
      }
      case "audio-chunk":
        result.audioChunks += 1;
        if (Buffer.from(event.delta, "base64").some((b) => b !== 0)) result.speechChunks += 1;
        break;
      case "transcript-fragment":
        result[event.speaker] += event.delta;
        if (answered && result.assistant.includes("healthy")) send({ type: "session-close", eventId: "close" });
        break;
      case "delegation-created":
        result.delegations.push({ id: event.delegationId, target: event.target });
        answered = true;
        send({ type: "context-append", eventId: "answer", delegationId: event.delegationId,
               content: "Staging is healthy.", providerOptions: { openai: { channel: "commentary" } } });
        break;
      case "command-acknowledged":
        result.acknowledged.push(event.clientEventId);
        break;
      case "error":
        result.errors.push(event);
        break;
      case "session-closed":
        result.closed = { reason: event.reason, usage: event.usage };
        break;
    }
  }
});
ws.on("close", () => {
  clearInterval(timer);
  console.log(JSON.stringify(result));
});
ws.on("error", (error) => {
  result.errors.push(String(error));
});
