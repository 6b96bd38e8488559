// The unmodified `openai` npm client against the gateway's speech API: one voice created from a prompt,
// then one speech request in it, streamed (wav).
// Usage: node openai_speech.mjs http://127.0.0.1:PORT/v1
// Prints one JSON line: what happened, for tests/interop/test_js_clients.py to check.
import OpenAI from "openai";

const [baseURL] = process.argv.slice(2);
const client = new OpenAI({ apiKey: process.env.OPENAI_API_KEY, baseURL, maxRetries: 0 });
const voice = await client.audio.voices.create({ name: "Calm", type: "prompt", prompt: "A calm, low voice." });
const response = await client.audio.speech.create({
  model: "tts-1", voice: { id: voice.id }, input: "Hello from Node.", response_format: "wav",
});
let bytes = 0;
let chunks = 0;
let head = null;
for await (const chunk of response.body) {
  if (head === null) head = Buffer.from(chunk).subarray(0, 12).toString("latin1");
  bytes += chunk.length;
  chunks += 1;
}
console.log(JSON.stringify({
  voice: { id: voice.id, object: voice.object, type: voice.type, name: voice.name },
  speech: { status: response.status, type: response.headers.get("content-type"), bytes, chunks, head },
}));
