// The page: one Realtime session (GA protocol) over a WebSocket to this same server.
import { decodePcm16, encodePcm16, Player, RATE, startMicrophone } from "./audio.js";

const $ = (id) => document.getElementById(id);

// Everything worth observing, kept in one place: the panels render from it and tests read it.
const stats = {
  state: "idle", // idle | connecting | connected | closed
  events: {}, // server event type → count
  sentAppends: 0,
  speechStarted: 0,
  speechStopped: 0,
  receivedSamples: 0,
  playedSamples: 0,
  underruns: 0,
  bargeIns: 0,
  truncates: [], // {item_id, audio_end_ms} as sent
  turns: [], // {n, itemId, responseId, speechEndAt, endEstimated, heardMs, server}
  errors: [],
};
window.__gateway = stats;

let ws = null;
let rtc = null; // the WebRTC call ({send, close}) when that transport is chosen
let rtcStream = null; // its microphone
let sessionId = null; // from session.created: names this session's turn records on the gateway
let mic = null;
let player = null;
let closing = false; // the user pressed Disconnect: a close is not an error
let session = null; // the session as the server last reported it
// When each append left the page, by input-audio time at its end (ms): speech_stopped's audio_end_ms
// then says when the user's last speech sample was sent, the start of what the user waits.
const sentLog = [];
let sentMs = 0;
const activeResponses = new Set(); // created, not yet done
const interrupted = new Set(); // responses whose remaining audio is dropped (barge-in)
const itemResponse = new Map(); // assistant item id → response id
const entries = new Map(); // item id → transcript entry {el, text}

// --- Connection -------------------------------------------------------------------------------

async function connect() {
  closing = false;
  setState("connecting");
  if ($("transport").value === "webrtc") return connectRtc();
  try {
    player = await Player.create(onPlayback);
    mic = await startMicrophone(sendAudio);
  } catch (err) {
    // The worklet modules come from the gateway too: a network error there means it is down.
    showError((await reachable()) ? err.message : `could not connect to the gateway at ${location.origin}`);
    teardown("idle");
    return;
  }
  if (closing) return teardown("closed"); // Disconnect was pressed while the microphone opened
  $("mic-rate").textContent = `microphone ${mic.rate} Hz → ${RATE} Hz`;
  const url = new URL("/v1/realtime", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const socket = new WebSocket(url);
  ws = socket;
  let opened = false;
  socket.onopen = () => {
    opened = true;
    setState("connected");
    send(sessionUpdate());
  };
  socket.onmessage = (e) => {
    if (ws === socket) handle(JSON.parse(e.data));
  };
  socket.onclose = (e) => {
    if (ws !== socket) return; // a connection already left by Disconnect
    if (!opened) showError(`could not connect to ${url}`);
    else if (!closing) showError(`connection closed by the server (code ${e.code}${e.reason ? `: ${e.reason}` : ""})`);
    teardown("closed");
  };
}

// WebRTC: the browser's media stack sends the microphone and plays the reply; the gateway owns the
// playout, so barge-in needs nothing from the page (the server clears its buffer and truncates).
async function connectRtc() {
  let health = null;
  try {
    health = await (await fetch("/healthz", { cache: "no-store" })).json();
  } catch {
    showError(`could not connect to the gateway at ${location.origin}`);
    return teardown("idle");
  }
  if (!health.webrtc) {
    showError("this gateway has no WebRTC path: enable [webrtc] and install the extra (pip install '.[webrtc]')");
    return teardown("idle");
  }
  try {
    rtcStream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    if (closing) return teardown("closed");
    const { connectWebRTC } = await import("./webrtc.js");
    const call = await connectWebRTC({
      url: location.origin,
      stream: rtcStream,
      audio: $("remote-audio"),
      session: sessionUpdate().session,
      onEvent: (e) => {
        if (rtc === call) handle(e);
      },
      onClose: (reason) => {
        if (rtc !== call) return;
        if (!closing) showError(`call ended: ${reason}`);
        teardown("closed");
      },
    });
    rtc = call;
    if (closing) return disconnect();
    $("mic-rate").textContent = "WebRTC (Opus 48 kHz)";
    setState("connected");
  } catch (err) {
    showError(`WebRTC call failed: ${err.message}`);
    teardown("idle");
  }
}

async function reachable() {
  try {
    return (await fetch("/healthz", { cache: "no-store" })).ok;
  } catch {
    return false;
  }
}

function disconnect() {
  closing = true;
  ws?.close(1000);
  rtc?.close();
  teardown("closed");
}

function teardown(state) {
  mic?.stop();
  player?.close();
  for (const track of rtcStream?.getTracks() ?? []) track.stop();
  mic = player = ws = rtc = rtcStream = null;
  activeResponses.clear();
  sentLog.length = 0; // the next connection is a new session, with its own input time
  sentMs = 0;
  setState(state);
}

function send(event) {
  if (rtc) rtc.send(event);
  else if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
}

function sendAudio(samples) {
  if (ws?.readyState !== WebSocket.OPEN) return;
  send({ type: "input_audio_buffer.append", audio: encodePcm16(samples) });
  stats.sentAppends++;
  sentMs += (samples.length * 1000) / RATE;
  sentLog.push([sentMs, performance.now()]);
  if (sentLog.length > 3000) sentLog.splice(0, 1000); // a minute of 20 ms appends is plenty
}

// When the user's speech ended, as this page can know it (performance.now() time, and whether estimated).
function speechEnd(audioEndMs) {
  const sent = sentLog.find(([endMs]) => endMs >= audioEndMs);
  if (sent) return { at: sent[1], estimated: false };
  // WebRTC: the browser sends the microphone itself; VAD reports the end after its silence.
  const silence = session?.audio?.input?.turn_detection?.silence_duration_ms ?? 0;
  return { at: performance.now() - silence, estimated: true };
}

// --- Server events ----------------------------------------------------------------------------

const handlers = {
  "session.created": (e) => {
    sessionId = e.session.id;
    showSession(e.session);
  },
  "session.updated": (e) => showSession(e.session),
  "input_audio_buffer.speech_started": onSpeechStarted,
  "input_audio_buffer.speech_stopped": onSpeechStopped,
  "conversation.item.input_audio_transcription.delta": (e) => appendText(e.item_id, "user", e.delta),
  "conversation.item.input_audio_transcription.completed": (e) =>
    setText(e.item_id, "user", e.transcript),
  "conversation.item.input_audio_transcription.failed": (e) =>
    setText(e.item_id, "user", `(transcription failed: ${e.error?.message ?? "unknown error"})`),
  "response.created": (e) => onResponseCreated(e.response),
  "response.output_item.added": (e) => {
    if (e.item?.type === "message") entry(e.item.id, "assistant");
  },
  "response.output_audio.delta": onAudioDelta,
  "response.output_audio.done": (e) => {
    if (!interrupted.has(e.response_id)) player?.end(e.item_id);
  },
  "response.output_audio_transcript.delta": (e) => appendText(e.item_id, "assistant", e.delta),
  "response.output_audio_transcript.done": (e) => setText(e.item_id, "assistant", e.transcript),
  "response.output_text.delta": (e) => appendText(e.item_id, "assistant", e.delta),
  "response.output_text.done": (e) => setText(e.item_id, "assistant", e.text),
  "response.done": onResponseDone,
  // WebRTC: the server's playout reports what the listener hears.
  "output_audio_buffer.started": (e) => onRtcPlayout("started", e.response_id),
  "output_audio_buffer.stopped": (e) => onRtcPlayout("finished", e.response_id),
  "output_audio_buffer.cleared": (e) => onRtcPlayout("finished", e.response_id),
  "conversation.item.truncated": (e) =>
    note(e.item_id, `interrupted: heard ${(e.audio_end_ms / 1000).toFixed(2)} s`),
  error: (e) => {
    showError(`${e.error?.code || e.error?.type || "error"}: ${e.error?.message}`);
    // A refused session.update changed nothing: put the form back to what the server holds.
    if (e.error?.param?.startsWith("session")) showSession(session);
  },
};

function handle(event) {
  stats.events[event.type] = (stats.events[event.type] || 0) + 1;
  handlers[event.type]?.(event);
}

async function onSpeechStarted(e) {
  stats.speechStarted++;
  setActivity("you are speaking");
  entry(e.item_id, "user").el.classList.add("pending");
  if (!player) return;
  // Barge-in: whatever is still coming for the responses under way will not be played.
  for (const id of activeResponses) interrupted.add(id);
  const { itemId, played, hadAudio } = await player.flush();
  if (!hadAudio || itemId === null) return;
  const audioEndMs = Math.floor((played * 1000) / RATE);
  send({ type: "conversation.item.truncate", item_id: itemId, content_index: 0, audio_end_ms: audioEndMs });
  stats.bargeIns++;
  stats.truncates.push({ item_id: itemId, audio_end_ms: audioEndMs });
}

function onSpeechStopped(e) {
  stats.speechStopped++;
  setActivity("thinking…");
  const user = entry(e.item_id, "user");
  if (!user.text) setText(e.item_id, "user", ""); // shows "(audio)" until a transcript arrives
  const end = speechEnd(e.audio_end_ms);
  stats.turns.push({
    n: stats.turns.length + 1,
    itemId: e.item_id,
    responseId: null,
    speechEndAt: end.at,
    endEstimated: end.estimated,
    heardMs: null,
    server: null,
  });
  renderLatency();
}

function onRtcPlayout(kind, responseId) {
  if (kind === "finished") return setActivity("listening");
  setActivity("assistant speaking");
  // The server started sending this reply's audio: the nearest the page gets to "heard" over WebRTC.
  const turn = stats.turns.find((t) => t.responseId === responseId && t.heardMs === null);
  if (turn) {
    turn.heardMs = Math.max(0, Math.round(performance.now() - turn.speechEndAt));
    renderLatency();
  }
}

function onResponseCreated(response) {
  activeResponses.add(response.id);
  // The response answers the latest turn that has none yet.
  const turn = stats.turns.findLast((t) => t.responseId === null);
  if (turn) turn.responseId = response.id;
}

function onAudioDelta(e) {
  if (interrupted.has(e.response_id) || !player) return;
  itemResponse.set(e.item_id, e.response_id);
  const samples = decodePcm16(e.delta);
  stats.receivedSamples += samples.length;
  player.push(e.item_id, samples);
}

function onResponseDone(e) {
  const response = e.response;
  activeResponses.delete(response.id);
  for (const item of response.output ?? []) {
    if (item.type !== "message") continue;
    const known = entries.get(item.id);
    if (known) setText(item.id, "assistant", known.text); // "(audio)" when no transcript came
    if (!interrupted.has(response.id)) player?.end(item.id);
  }
  if (response.status === "failed") {
    const err = response.status_details?.error;
    showError(`response failed: ${err?.message ?? err?.code ?? "no details"}`);
  }
  fetchServerLatency(response.id);
}

function onPlayback(msg) {
  if (msg.type === "started") {
    setActivity("assistant speaking");
    const turn = stats.turns.find((t) => t.responseId === itemResponse.get(msg.itemId) && t.heardMs === null);
    if (turn) {
      turn.heardMs = Math.max(0, Math.round(msg.heardAt - turn.speechEndAt));
      renderLatency();
    }
  } else if (msg.type === "progress") {
    stats.playedSamples = msg.played;
    stats.underruns = msg.underruns;
    $("played").textContent = `${(msg.played / RATE).toFixed(1)} s played, ${msg.underruns} underruns`;
  } else if (msg.type === "finished") {
    setActivity("listening");
  }
}

// --- Latency ----------------------------------------------------------------------------------

// The gateway's own timings of a turn, from its trace: each stage in ms after the end of the user's speech.
const SERVER_STAGES = ["stt_done_ms", "llm_first_token_ms", "tts_first_audio_ms", "first_delta_ms"];

async function fetchServerLatency(responseId) {
  if (!sessionId) return;
  try {
    const reply = await fetch(`/v1/realtime/sessions/${encodeURIComponent(sessionId)}/turns`);
    if (!reply.ok) return;
    const record = (await reply.json()).turns.find((t) => t.response_id === responseId);
    if (!record) return;
    const figures = SERVER_STAGES.filter((k) => k in record).map((k) => [k, record[k].toFixed(0)]);
    if (figures.length) recordServerLatency(responseId, Object.fromEntries(figures));
  } catch {
    // The panel simply keeps "—": the figures are a nicety, the conversation goes on.
  }
}

function recordServerLatency(responseId, figures) {
  const turn = stats.turns.find((t) => t.responseId === responseId);
  if (!turn) return;
  turn.server = figures;
  renderLatency();
}

function renderLatency() {
  const rows = stats.turns.map((t) => {
    const server = t.server
      ? Object.entries(t.server)
          .map(([k, v]) => `${k.replace(/_ms$/, "")} ${v} ms`)
          .join(" · ")
      : "—";
    const heard = t.heardMs === null ? "…" : `${t.endEstimated ? "≈" : ""}${t.heardMs} ms`;
    return `<tr><td>${t.n}</td><td>${heard}</td><td>${escapeHtml(server)}</td></tr>`;
  });
  $("latency-rows").innerHTML = rows.reverse().join("");
}

// --- Transcript -------------------------------------------------------------------------------

function entry(itemId, role) {
  let e = entries.get(itemId);
  if (!e) {
    const el = document.createElement("li");
    el.className = role;
    el.innerHTML = `<span class="who">${role === "user" ? "You" : "Assistant"}</span><span class="text"></span>`;
    $("transcript").append(el);
    e = { el, text: "" };
    entries.set(itemId, e);
  }
  return e;
}

function setText(itemId, role, text) {
  const e = entry(itemId, role);
  e.text = text ?? "";
  e.el.querySelector(".text").textContent = e.text || "(audio)";
  e.el.classList.remove("pending");
  e.el.scrollIntoView({ block: "nearest" });
}

function appendText(itemId, role, delta) {
  const e = entry(itemId, role);
  setText(itemId, role, e.text + (delta ?? ""));
}

function note(itemId, text) {
  const e = entries.get(itemId);
  if (!e) return;
  const small = document.createElement("small");
  small.textContent = text;
  e.el.append(small);
}

// --- Settings ---------------------------------------------------------------------------------

function sessionUpdate() {
  const vad = $("vad").checked
    ? {
        type: "server_vad",
        threshold: Number($("threshold").value),
        silence_duration_ms: Number($("silence").value),
        prefix_padding_ms: Number($("prefix").value),
      }
    : null;
  return {
    type: "session.update",
    session: {
      type: "realtime",
      audio: {
        input: { format: { type: "audio/pcm", rate: RATE }, turn_detection: vad },
        output: { format: { type: "audio/pcm", rate: RATE }, voice: $("voice").value },
      },
    },
  };
}

// Shows what the server actually holds, so the form never claims a setting it refused.
function showSession(held) {
  session = held;
  const input = held?.audio?.input;
  const voice = held?.audio?.output?.voice;
  if (voice) $("voice").value = voice;
  if (input && "turn_detection" in input) {
    const vad = input.turn_detection;
    $("vad").checked = vad !== null;
    if (vad?.threshold !== undefined) $("threshold").value = vad.threshold;
    if (vad?.silence_duration_ms !== undefined) $("silence").value = vad.silence_duration_ms;
    if (vad?.prefix_padding_ms !== undefined) $("prefix").value = vad.prefix_padding_ms;
    $("commit").disabled = vad !== null;
  }
}

// --- Page -------------------------------------------------------------------------------------

function setState(state) {
  stats.state = state;
  $("status").textContent = state;
  $("status").dataset.state = state;
  $("connect").textContent = state === "connected" || state === "connecting" ? "Disconnect" : "Connect";
  $("apply").disabled = state !== "connected";
  $("commit").disabled = state !== "connected" || $("vad").checked;
  setActivity(state === "connected" ? "listening" : "");
}

function setActivity(text) {
  $("activity").textContent = text;
}

function showError(text) {
  stats.errors.push(text);
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  $("errors").prepend(li);
  $("errors-panel").hidden = false;
}

function escapeHtml(text) {
  return text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

$("connect").addEventListener("click", () => (stats.state === "connecting" || stats.state === "connected" ? disconnect() : connect()));
$("settings").addEventListener("submit", (e) => {
  e.preventDefault();
  send(sessionUpdate());
});
$("commit").addEventListener("click", () => {
  send({ type: "input_audio_buffer.commit" });
  send({ type: "response.create" });
});
// Closing the tab hangs up at once (WebRTC: the DELETE goes out with keepalive), rather than leaving the
// gateway to notice the silence.
window.addEventListener("pagehide", () => {
  if (ws || rtc) disconnect();
});
$("clear-errors").addEventListener("click", () => {
  $("errors").replaceChildren();
  $("errors-panel").hidden = true;
});
setState("idle");
