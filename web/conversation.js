// The Conversation tab: one Realtime session (GA protocol) over a WebSocket or WebRTC to this same server.
//
// What the page shows is what is true: the status is idle, connecting, connected or disconnected (the server
// or the network ended it; Stop is idle); the activity goes back to "listening" after every reply, failed or
// not; a failure is told once; an interrupted reply shows what was heard of it, the rest greyed out.
import { sessionCredential } from "./access.js";
import { decodePcm16, encodePcm16, openMeteredMicrophone, Player, RATE, startMicrophone } from "./audio.js";
import { $ } from "./dom.js";
import { refreshHealth } from "./health.js";
import { fetchServerLatency, mark, turnOf } from "./latency.js";
import { showNotice } from "./notices.js";
import { stats } from "./state.js";
import { appendText, entry, known, note, setText, showHeard } from "./transcript.js";
import { chooseVoice, requested } from "./voices.js";

let ws = null;
let rtc = null; // the WebRTC call ({send, close}) when that transport is chosen
let rtcMic = null; // its microphone (openMeteredMicrophone)
let credential = null; // the client secret (or key) this session connected with: also for its turns
let sessionId = null; // from session.created: names this session's turn records on the gateway
let mic = null;
let player = null;
// Reply audio not yet played out: items queued in the player, or (WebRTC) the server's playout running.
const unplayed = new Set();
let closing = false; // the user pressed Stop: a close is not an error
let session = null; // the session as the server last reported it
// When each append left the page, by input-audio time at its end (ms): speech_stopped's audio_end_ms
// then says when the user's last speech sample was sent, the start of what the user waits.
const sentLog = [];
let sentMs = 0;
const activeResponses = new Set(); // created, not yet done
const interrupted = new Set(); // responses whose remaining audio is dropped (barge-in)
const itemResponse = new Map(); // assistant item id → response id
const awaitingHeard = new Set(); // truncated assistant items whose heard transcript was asked for

// --- Connection -------------------------------------------------------------------------------

export async function connect() {
  closing = false;
  setState("connecting");
  if (!stats.responder) await refreshHealth(); // the first session.update asks for transcripts if it can
  if ($("transport").value === "webrtc") return connectRtc();
  try {
    credential = await sessionCredential();
    player = await Player.create(onPlayback);
    mic = await startMicrophone(sendAudio, $("mic").value || null);
  } catch (err) {
    // The worklet modules come from the gateway too: a network error there means it is down.
    showNotice((await reachable()) ? err.message : `could not connect to the gateway at ${location.origin}`);
    teardown("idle");
    return;
  }
  if (closing) return teardown("idle"); // Stop was pressed while the microphone opened
  micOpened(mic, `${mic.rate} Hz → ${RATE} Hz`);
  const url = new URL("/v1/realtime", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  // A browser cannot set headers on a WebSocket: the credential travels as a subprotocol.
  const protocols = credential ? ["realtime", `openai-insecure-api-key.${credential}`] : [];
  const socket = new WebSocket(url, protocols);
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
    if (ws !== socket) return; // a connection already left by Stop
    if (!opened) {
      // The browser hides the refusal's reason: name the likely one.
      const hint = stats.authRequired && !credential ? ": this gateway needs an API key (Access)" : "";
      showNotice(`could not connect to ${url}${hint}`);
      return teardown("idle");
    }
    if (e.code === 1001) showNotice("server closed the session", { level: "warn" });
    else if (!closing) showNotice(`connection closed by the server (code ${e.code}${e.reason ? `: ${e.reason}` : ""})`);
    teardown(closing ? "idle" : "closed");
  };
}

// WebRTC: the browser's media stack sends the microphone and plays the reply; the gateway owns the
// playout, so barge-in needs nothing from the page (the server clears its buffer and truncates).
async function connectRtc() {
  const health = await refreshHealth();
  if (!health) {
    showNotice(`could not connect to the gateway at ${location.origin}`);
    return teardown("idle");
  }
  if (!health.webrtc) {
    showNotice("this gateway has no WebRTC path: enable [webrtc] and install the extra (pip install '.[webrtc]')");
    return teardown("idle");
  }
  try {
    credential = await sessionCredential();
    rtcMic = await openMeteredMicrophone($("mic").value || null);
    if (closing) return teardown("idle");
    micOpened(rtcMic, "WebRTC (Opus 48 kHz)");
    const { connectWebRTC } = await import("./webrtc.js");
    const call = await connectWebRTC({
      url: location.origin,
      stream: rtcMic.stream,
      token: credential,
      audio: $("remote-audio"),
      session: sessionUpdate().session,
      onEvent: (e) => {
        if (rtc === call) handle(e);
      },
      onClose: (reason) => {
        if (rtc !== call) return;
        if (!closing) showNotice(`call ended: ${reason}`);
        teardown(closing ? "idle" : "closed");
      },
    });
    rtc = call;
    if (closing) return disconnect();
    setState("connected");
  } catch (err) {
    showNotice(`WebRTC call failed: ${err.message}`);
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

// Stop: a normal end, back to idle.
export function disconnect() {
  closing = true;
  ws?.close(1000);
  rtc?.close();
  teardown("idle");
}

export function live() {
  return stats.state === "connecting" || stats.state === "connected";
}

export function hangUpOnLeave() {
  if (ws || rtc) disconnect();
}

function teardown(state) {
  mic?.stop();
  player?.close();
  rtcMic?.stop();
  mic = player = ws = rtc = rtcMic = null;
  unplayed.clear();
  activeResponses.clear();
  sentLog.length = 0; // the next connection is a new session, with its own input time
  sentMs = 0;
  setState(state);
}

export function send(event) {
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
  "conversation.item.input_audio_transcription.completed": (e) => {
    setText(e.item_id, "user", e.transcript);
    mark(stats.turns.find((t) => t.itemId === e.item_id), "transcript");
  },
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
  "response.output_audio_transcript.delta": onTextDelta,
  "response.output_audio_transcript.done": (e) => setText(e.item_id, "assistant", e.transcript),
  "response.output_text.delta": onTextDelta,
  "response.output_text.done": (e) => setText(e.item_id, "assistant", e.text),
  "response.done": onResponseDone,
  // WebRTC: the server's playout reports what the listener hears.
  "output_audio_buffer.started": (e) => onRtcPlayout("started", e.response_id),
  "output_audio_buffer.stopped": (e) => onRtcPlayout("finished", e.response_id),
  "output_audio_buffer.cleared": (e) => onRtcPlayout("cleared", e.response_id),
  "conversation.item.truncated": (e) => {
    known(e.item_id)?.el.classList.add("interrupted");
    note(e.item_id, `interrupted: heard ${(e.audio_end_ms / 1000).toFixed(2)} s`);
    // The gateway cut the item's transcript at the words heard: ask for it, to show them apart.
    awaitingHeard.add(e.item_id);
    send({ type: "conversation.item.retrieve", item_id: e.item_id });
  },
  "conversation.item.retrieved": (e) => {
    if (!awaitingHeard.delete(e.item.id)) return;
    const part = e.item.content?.find((p) => p.type === "output_audio" || p.type === "output_text");
    showHeard(e.item.id, part?.transcript ?? part?.text ?? "");
  },
  error: (e) => {
    // The drain notice (the gateway is shutting down; the session closes soon) is a warning, not a fault.
    if (e.error?.code === "server_shutting_down") return showNotice(e.error.message, { level: "warn" });
    showNotice(`${e.error?.code || e.error?.type || "error"}: ${e.error?.message}`, { key: e.error?.message });
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
  unplayed.clear();
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
    marks: {}, // stage → ms after speechEndAt, as this page saw it (see latency.js)
  });
  mark(stats.turns.at(-1), "stopped");
}

function onRtcPlayout(kind, responseId) {
  if (kind === "finished" || kind === "cleared") {
    if (kind === "cleared") unplayed.clear();
    else unplayed.delete(responseId);
    return idleIfDone();
  }
  unplayed.add(responseId);
  setActivity("assistant speaking");
  // The server started sending this reply's audio: the nearest the page gets to "heard" over WebRTC.
  const turn = stats.turns.find((t) => t.responseId === responseId && t.heardMs === null);
  if (turn) {
    turn.heardMs = Math.max(0, Math.round(performance.now() - turn.speechEndAt));
    mark(turn, "audio");
    mark(turn, "heard");
  }
}

function onResponseCreated(response) {
  activeResponses.add(response.id);
  // The response answers the latest turn that has none yet.
  const turn = stats.turns.findLast((t) => t.responseId === null);
  if (turn) turn.responseId = response.id;
}

function onTextDelta(e) {
  appendText(e.item_id, "assistant", e.delta);
  mark(turnOf(e.response_id), "token");
}

function onAudioDelta(e) {
  mark(turnOf(e.response_id), "audio");
  if (interrupted.has(e.response_id) || !player) return;
  itemResponse.set(e.item_id, e.response_id);
  const samples = decodePcm16(e.delta);
  stats.receivedSamples += samples.length;
  unplayed.add(e.item_id);
  player.push(e.item_id, samples);
}

function onResponseDone(e) {
  const response = e.response;
  activeResponses.delete(response.id);
  for (const item of response.output ?? []) {
    if (item.type !== "message") continue;
    const row = known(item.id);
    if (response.status === "cancelled") row?.el.classList.add("interrupted");
    if (row) setText(item.id, "assistant", row.text); // "(audio)" when no transcript came
    if (!interrupted.has(response.id)) player?.end(item.id);
  }
  if (response.status === "failed") {
    const err = response.status_details?.error;
    // Told once: the error event before it said the same.
    showNotice(`response failed: ${err?.message ?? err?.code ?? "no details"}`, { key: err?.message });
    refreshHealth(); // the banner shows which backend is down
  }
  idleIfDone();
  fetchServerLatency(sessionId, credential, response.id);
}

// Back to listening once no reply is running or playing: after a failure, a cancel or a text-only reply too.
function idleIfDone() {
  if (stats.state === "connected" && !unplayed.size && !activeResponses.size && stats.activity !== "you are speaking") {
    setActivity("listening");
  }
}

function onPlayback(msg) {
  if (msg.type === "started") {
    setActivity("assistant speaking");
    const turn = stats.turns.find((t) => t.responseId === itemResponse.get(msg.itemId) && t.heardMs === null);
    if (turn) {
      turn.heardMs = Math.max(0, Math.round(msg.heardAt - turn.speechEndAt));
      mark(turn, "heard", msg.heardAt);
    }
  } else if (msg.type === "progress") {
    stats.playedSamples = msg.played;
    stats.underruns = msg.underruns;
    $("played").textContent = `${(msg.played / RATE).toFixed(1)} s played, ${msg.underruns} underruns`;
  } else if (msg.type === "finished") {
    unplayed.delete(msg.itemId);
    idleIfDone();
  }
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
  const instructions = $("instructions").value.trim();
  // A voice only when the gateway has several to choose from (the menu is off otherwise).
  const voice = !$("voice").disabled && $("voice").value ? { voice: requested($("voice").value) } : {};
  return {
    type: "session.update",
    session: {
      type: "realtime",
      ...(instructions ? { instructions } : {}), // empty: the gateway's default stays
      audio: {
        input: {
          format: { type: "audio/pcm", rate: RATE },
          turn_detection: vad,
          // Transcripts of what you say, when the gateway has a speech-to-text (the banner names it).
          ...(stats.responder?.models?.stt ? { transcription: { model: "whisper-1" } } : {}),
        },
        output: { format: { type: "audio/pcm", rate: RATE }, ...voice },
      },
    },
  };
}

// Shows what the server actually holds, so the form never claims a setting it refused.
function showSession(held) {
  session = held;
  if (typeof held?.instructions === "string") $("instructions").value = held.instructions;
  const input = held?.audio?.input;
  const voice = held?.audio?.output?.voice;
  if (voice && !$("voice").disabled) chooseVoice($("voice"), voice);
  if (input && "turn_detection" in input) {
    const vad = input.turn_detection;
    $("vad").checked = vad !== null;
    if (vad?.threshold !== undefined) $("threshold").value = vad.threshold;
    if (vad?.silence_duration_ms !== undefined) $("silence").value = vad.silence_duration_ms;
    if (vad?.prefix_padding_ms !== undefined) $("prefix").value = vad.prefix_padding_ms;
    $("commit").disabled = vad !== null;
  }
}

export function applySettings() {
  send(sessionUpdate());
}

export function commitTurn() {
  send({ type: "input_audio_buffer.commit" });
  send({ type: "response.create" });
}

// --- Microphone --------------------------------------------------------------------------------

// The audio inputs, named once the page has permission (before it, browsers hide the labels).
export async function listMicrophones() {
  const devices = (await navigator.mediaDevices?.enumerateDevices?.()) ?? [];
  const inputs = devices.filter((d) => d.kind === "audioinput" && d.deviceId !== "default");
  const chosen = $("mic").value;
  const options = [new Option("Default microphone", "")];
  inputs.forEach((d, i) => options.push(new Option(d.label || `Microphone ${i + 1}`, d.deviceId)));
  $("mic").replaceChildren(...options);
  if (inputs.some((d) => d.deviceId === chosen)) $("mic").value = chosen;
}

function micOpened(opened, detail) {
  $("mic-name").textContent = opened.label;
  $("mic-rate").textContent = detail;
  listMicrophones(); // permission granted now: the names are known
  meter(opened.level);
}

// The level meter follows the open microphone, one reading per frame.
function meter(level) {
  const draw = () => {
    const open = mic ?? rtcMic;
    if (!open || open.level !== level) {
      $("level-bar").style.width = "0";
      return;
    }
    const rms = level();
    stats.levelPeak = Math.max(stats.levelPeak, rms);
    // On a dB scale: speech sits around -30 dBFS to -10 dBFS; below -60 dBFS shows nothing.
    const db = 20 * Math.log10(Math.max(rms, 1e-6));
    $("level-bar").style.width = `${Math.min(100, Math.max(0, ((db + 60) / 60) * 100)).toFixed(0)}%`;
    requestAnimationFrame(draw);
  };
  requestAnimationFrame(draw);
}

// --- State ------------------------------------------------------------------------------------

const STATE_TEXT = { idle: "idle", connecting: "connecting", connected: "connected", closed: "disconnected" };

export function setState(state) {
  stats.state = state;
  $("status").textContent = STATE_TEXT[state];
  $("status").dataset.state = state;
  $("connect").textContent = live() ? "Stop" : "Start";
  $("connect").dataset.state = state;
  $("apply").disabled = state !== "connected";
  $("commit").disabled = state !== "connected" || $("vad").checked;
  if (!live()) {
    $("mic-name").textContent = "no microphone open";
    $("mic-rate").textContent = "";
  }
  setActivity(state === "connected" ? "listening" : "");
}

function setActivity(text) {
  stats.activity = text;
  $("activity").textContent = text;
}

