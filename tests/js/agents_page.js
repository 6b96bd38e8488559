// Test page entry for @openai/agents-realtime in Chromium (bundled by esbuild in tests/interop/test_js_clients.py
// and served by the gateway itself): one turn over the SDK's WebRTC or WebSocket transport.
import { RealtimeAgent, RealtimeSession } from "@openai/agents-realtime";

window.runTurn = async ({ transport, apiKey, url }) => {
  const events = [];
  const agent = new RealtimeAgent({ name: "Assistant", instructions: "Answer briefly." });
  const session = new RealtimeSession(agent, { transport, model: "gpt-realtime" });
  const done = new Promise((resolve, reject) => {
    session.transport.on("*", (event) => {
      events.push(event.type);
      if (event.type === "response.done") resolve(event);
    });
    session.on("error", (e) => events.push(`error: ${JSON.stringify(e.error?.error ?? e.error ?? e)}`));
    setTimeout(() => reject(new Error(`no response.done; events: ${events.join(", ")}`)), 20_000);
  });
  await session.connect({ apiKey, url });
  if (transport === "websocket") {
    // No microphone on this transport: the page streams a recorded sentence, then silence, in 100 ms chunks.
    const pcm = await (await fetch("/speech.pcm")).arrayBuffer();
    for (let i = 0; i < pcm.byteLength; i += 4800) {
      session.sendAudio(pcm.slice(i, i + 4800));
      await new Promise((r) => setTimeout(r, 10));
    }
  }
  const response = await done;
  session.close();
  return { events, status: response.response.status };
};
