// The Live tab: a GPT-Live session (WS /v1/live/sessions) from the browser. The microphone streams continuously
// (the session's clock is its audio), the output is one continuous track, the transcript sits on the session's
// timeline, and delegation shows as it happens: a client delegation can be answered here with commentary, a
// Responses delegation's backend events and function calls are listed (a call's output can be sent back).
import { sessionCredential } from "./access.js";
import { decodePcm16, encodePcm16, Player, startMicrophone } from "./audio.js";
import { $, escapeHtml } from "./dom.js";
import { showNotice } from "./notices.js";

let ws = null;
let mic = null;
let player = null;
let current = null; // the transcript line being written: {role, item}

function panel() {
  const main = $("live-tab");
  main.innerHTML = `
    <section class="conversation">
      <div class="controls">
        <button id="live-connect" type="button" class="big" data-state="idle">Start</button>
        <span id="live-status" class="meta">idle</span>
      </div>
      <ol id="live-timeline" class="timeline"></ol>
    </section>
    <aside>
      <form id="live-settings">
        <h2>Live session</h2>
        <label class="stack">Instructions
          <textarea id="live-instructions" rows="4" placeholder="The gateway's default"></textarea>
        </label>
        <label>Voice <input id="live-voice" value="marin" /></label>
        <label>Delegation
          <select id="live-delegation">
            <option value="client">client (answer here)</option>
            <option value="responses">responses (the gateway's backend)</option>
          </select>
        </label>
        <label>Backend model <input id="live-backend" value="gpt-5.6-terra" /></label>
        <p class="meta">Applies at the next Start; a Live session's settings are fixed once it starts.</p>
      </form>
    </aside>`;
  $("live-connect").addEventListener("click", () => (ws ? stop() : start()));
}

function send(event) {
  if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
}

function line(role, html, at) {
  const item = document.createElement("li");
  item.className = role;
  item.innerHTML = `<time>${(at / 1000).toFixed(1)} s</time> ${html}`;
  $("live-timeline").append(item);
  item.scrollIntoView({ block: "nearest" });
  return item;
}

// A speaker's words go on their line until the other one speaks (a delegation shown meanwhile does not break it).
function transcript(role, delta, at) {
  if (current?.role !== role) current = { role, item: line(role, `<b>${role === "user" ? "You" : "Voice"}:</b> `, at) };
  current.item.append(delta);
}

function delegation(event) {
  const { id, target, response_id: responseId } = event.delegation;
  const item = line("delegation", `Delegated (<code>${escapeHtml(id)}</code>, ${target}` +
    `${responseId ? `, ${escapeHtml(responseId)}` : ""})`, event.offset_ms);
  if (target !== "client") return;
  const form = document.createElement("form");
  form.innerHTML = `<input placeholder="The result, for the voice to say" /> <button>Send commentary</button>`;
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const content = form.querySelector("input").value.trim();
    if (content) send({ type: "session.commentary.append", delegation_id: id, content });
    form.remove();
    item.append(` → “${content}”`);
  });
  item.append(form);
}

function backendEvent(envelope) {
  const event = envelope.event;
  if (event.type === "response.output_item.done" && event.item?.type === "function_call") {
    const { call_id: callId, name, arguments: args } = event.item;
    const item = line("delegation", `Backend calls <code>${escapeHtml(name)}(${escapeHtml(args)})</code>`, 0);
    item.querySelector("time").remove();
    const form = document.createElement("form");
    form.innerHTML = `<input placeholder="Its output (JSON or text)" /> <button>Send output</button>`;
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      send({ type: "response.item.create", item: { type: "function_call_output", call_id: callId,
                                                   output: form.querySelector("input").value } });
      send({ type: "response.create" });
      form.remove();
    });
    item.append(form);
  } else if (event.type === "response.output_item.done" && event.item?.type === "mcp_call") {
    line("delegation", `Backend used ${escapeHtml(event.item.server_label)}.${escapeHtml(event.item.name)}`, 0)
      .querySelector("time").remove();
  }
}

function handle(event) {
  switch (event.type) {
    case "session.started":
      $("live-status").textContent = `live: ${event.session.id} (${event.session.delegation.type} delegation)`;
      break;
    case "session.output_audio.delta":
      player?.push("live", decodePcm16(event.delta));
      break;
    case "session.input_transcript.delta":
      transcript("user", event.delta, event.start_ms);
      break;
    case "session.output_transcript.delta":
      transcript("assistant", event.delta, event.start_ms);
      break;
    case "session.delegation.created":
      delegation(event);
      break;
    case "response.event":
      backendEvent(event);
      break;
    case "session.usage.updated":
      $("live-status").textContent = $("live-status").textContent.replace(/ · \d+ s$/, "") +
        ` · ${event.usage.seconds} s`;
      break;
    case "error":
      showNotice(`Live: ${event.error.message}`);
      break;
    case "session.closed":
      $("live-status").textContent = `closed (${event.reason}) after ${event.usage.seconds} s`;
      break;
  }
}

function sessionConfig() {
  const session = { model: "gpt-live-1", audio: { output: { voice: $("live-voice").value || "marin" } } };
  const instructions = $("live-instructions").value.trim();
  if (instructions) session.instructions = instructions;
  if ($("live-delegation").value === "responses") {
    session.delegation = { type: "responses", responses: { model: $("live-backend").value || "gpt-5.6-terra" } };
  }
  return session;
}

async function start() {
  $("live-connect").textContent = "Stop";
  $("live-timeline").replaceChildren();
  current = null;
  let credential;
  try {
    credential = await sessionCredential();
    player = await Player.create(() => {});
    mic = await startMicrophone((chunk) => send({ type: "session.input_audio.append", audio: encodePcm16(chunk) }));
  } catch (err) {
    showNotice(err.message);
    return teardown();
  }
  const url = new URL("/v1/live/sessions", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  // A browser cannot set headers on a WebSocket: the credential (our ek_ secret) travels as a subprotocol.
  ws = new WebSocket(url, credential ? ["realtime", `openai-insecure-api-key.${credential}`] : []);
  ws.onopen = () => send({ type: "session.start", session: sessionConfig() });
  ws.onmessage = (e) => handle(JSON.parse(e.data));
  ws.onclose = () => teardown();
}

function stop() {
  if (ws?.readyState === WebSocket.OPEN) send({ type: "session.close" });
  else teardown();
}

function teardown() {
  ws = null;
  mic?.stop();
  mic = null;
  player?.close();
  player = null;
  $("live-connect").textContent = "Start";
}

panel();
