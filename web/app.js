// The page: one Realtime session (GA protocol) over a WebSocket or WebRTC to this same server.
import { decodePcm16, encodePcm16, openMeteredMicrophone, Player, RATE, startMicrophone } from "./audio.js";

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
  turns: [], // {n, itemId, responseId, speechEndAt, endEstimated, heardMs, server, marks}
  errors: [],
  levelPeak: 0, // the loudest the meter showed (0..1 RMS)
  responder: null, // /healthz's "responder": what answers
  authRequired: false,
};
window.__gateway = stats;

let ws = null;
let rtc = null; // the WebRTC call ({send, close}) when that transport is chosen
let rtcMic = null; // its microphone (openMeteredMicrophone)
let credential = null; // the client secret (or key) this session connected with: also for its turns
let sessionId = null; // from session.created: names this session's turn records on the gateway
let mic = null;
let player = null;
let closing = false; // the user pressed Stop: a close is not an error
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
  if (!stats.responder) await showResponder(); // the first session.update asks for transcripts if it can
  if ($("transport").value === "webrtc") return connectRtc();
  try {
    credential = await sessionCredential();
    player = await Player.create(onPlayback);
    mic = await startMicrophone(sendAudio, $("mic").value || null);
  } catch (err) {
    // The worklet modules come from the gateway too: a network error there means it is down.
    showError((await reachable()) ? err.message : `could not connect to the gateway at ${location.origin}`);
    teardown("idle");
    return;
  }
  if (closing) return teardown("closed"); // Stop was pressed while the microphone opened
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
      showError(`could not connect to ${url}${hint}`);
    } else if (e.code === 1001) showError("server closed the session", "warn");
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
    credential = await sessionCredential();
    rtcMic = await openMeteredMicrophone($("mic").value || null);
    if (closing) return teardown("closed");
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
        if (!closing) showError(`call ended: ${reason}`);
        teardown("closed");
      },
    });
    rtc = call;
    if (closing) return disconnect();
    setState("connected");
  } catch (err) {
    showError(`WebRTC call failed: ${err.message}`);
    teardown("idle");
  }
}

// What the session connects with: a client secret as given, or one minted with the API key (so the
// long-lived key never rides in a WebSocket header), or nothing on an open gateway.
async function sessionCredential() {
  const key = $("api-key").value.trim();
  if (!key || key.startsWith("ek_")) return key || null;
  let reply;
  try {
    reply = await fetch("/v1/realtime/client_secrets", {
      method: "POST",
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
      body: JSON.stringify({ session: { type: "realtime" } }),
    });
  } catch {
    throw new Error(`could not connect to the gateway at ${location.origin}`);
  }
  const body = await reply.json().catch(() => ({}));
  if (!reply.ok) throw new Error(`the API key was refused (${reply.status}): ${body.error?.message ?? "no details"}`);
  return body.value;
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
  rtcMic?.stop();
  mic = player = ws = rtc = rtcMic = null;
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
  "output_audio_buffer.cleared": (e) => onRtcPlayout("finished", e.response_id),
  "conversation.item.truncated": (e) => {
    entries.get(e.item_id)?.el.classList.add("interrupted");
    note(e.item_id, `interrupted: heard ${(e.audio_end_ms / 1000).toFixed(2)} s`);
  },
  error: (e) => {
    // The drain notice (the gateway is shutting down; the session closes soon) is a warning, not a fault.
    if (e.error?.code === "server_shutting_down") return showError(e.error.message, "warn");
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
    marks: {}, // stage → ms after speechEndAt, as this page saw it (see STAGES)
  });
  mark(stats.turns.at(-1), "stopped");
}

function onRtcPlayout(kind, responseId) {
  if (kind === "finished") return setActivity("listening");
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
  player.push(e.item_id, samples);
}

function onResponseDone(e) {
  const response = e.response;
  activeResponses.delete(response.id);
  for (const item of response.output ?? []) {
    if (item.type !== "message") continue;
    const known = entries.get(item.id);
    if (response.status === "cancelled") known?.el.classList.add("interrupted");
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
      mark(turn, "heard", msg.heardAt);
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

// A turn's milestones, each in ms after the end of the user's speech (when the page sent its last
// sample; over WebRTC estimated from speech_stopped less the VAD's silence).
// [stage, legend, color, what it is]
const STAGES = [
  ["stopped", "turn detected", "#94a3b8", "the gateway's VAD ended your turn (speech_stopped)"],
  ["transcript", "transcript", "#0ea5e9", "your words transcribed"],
  ["token", "first token", "#a855f7", "the LLM's first token (the gateway's trace, else the first reply text)"],
  ["audio", "first audio", "#f59e0b", "the reply's first audio reached the page"],
  ["heard", "heard", "#16a34a", "the reply's first audio played"],
];
const CHART_TURNS = 6; // the latest turns drawn

function turnOf(responseId) {
  return stats.turns.find((t) => t.responseId === responseId);
}

// Records a milestone the first time the turn reaches it.
function mark(turn, stage, at = performance.now()) {
  if (!turn || stage in turn.marks) return;
  turn.marks[stage] = Math.max(0, Math.round(at - turn.speechEndAt));
  renderLatency();
}

// The gateway's own timings of a turn, from its trace: each stage in ms after the end of the user's speech.
const SERVER_STAGES = ["stt_done_ms", "llm_first_token_ms", "tts_first_audio_ms", "first_delta_ms"];

async function fetchServerLatency(responseId) {
  if (!sessionId) return;
  try {
    const headers = credential ? { Authorization: `Bearer ${credential}` } : {};
    const reply = await fetch(`/v1/realtime/sessions/${encodeURIComponent(sessionId)}/turns`, { headers });
    if (!reply.ok) return;
    const record = (await reply.json()).turns.find((t) => t.response_id === responseId);
    if (!record) return;
    const figures = SERVER_STAGES.filter((k) => k in record).map((k) => [k, Math.round(record[k])]);
    if (figures.length) recordServerLatency(responseId, Object.fromEntries(figures));
  } catch {
    // The chart keeps what the page saw itself: the figures are a nicety, the conversation goes on.
  }
}

function recordServerLatency(responseId, figures) {
  const turn = turnOf(responseId);
  if (!turn) return;
  turn.server = figures;
  // The LLM's first token is only the gateway's to see (its text goes out with the audio spoken from it):
  // its figure counts from the gateway's speech_stopped, which reached the page at the "stopped" mark.
  if ("llm_first_token_ms" in figures && "stopped" in turn.marks) {
    turn.marks.token = turn.marks.stopped + figures.llm_first_token_ms;
  }
  renderLatency();
}

// The chart: per turn, one bar per milestone from the end of speech, on one axis in ms.
function renderLatency() {
  const turns = stats.turns.slice(-CHART_TURNS);
  const [left, top, width, bar, gap] = [64, 28, 520, 9, 10];
  const groupHeight = STAGES.length * bar + gap;
  const axisY = top + turns.length * groupHeight + 4;
  const highest = Math.max(500, ...turns.flatMap((t) => Object.values(t.marks)));
  const step = niceStep(highest / 5);
  const max = Math.ceil(highest / step) * step;
  const x = (ms) => left + (ms / max) * width;
  const parts = [];
  // The grid first: the bars are drawn over it.
  for (let ms = 0; ms <= max; ms += step) {
    parts.push(`<line x1="${x(ms)}" x2="${x(ms)}" y1="${top - 4}" y2="${axisY}" class="grid"/>`,
      `<text x="${x(ms)}" y="${axisY + 14}" text-anchor="middle" class="tick">${ms}</text>`);
  }
  parts.push(`<text x="${left + width}" y="${axisY + 28}" text-anchor="end" class="tick">ms after the end of your speech</text>`);
  STAGES.forEach(([, label, color, meaning], i) => {
    const lx = left + i * 104;
    parts.push(`<g><title>${meaning}</title><rect x="${lx}" y="6" width="10" height="10" fill="${color}"/>`,
      `<text x="${lx + 14}" y="15" class="legend">${label}</text></g>`);
  });
  turns.forEach((turn, g) => {
    const y0 = top + g * groupHeight;
    const server = turn.server ? Object.entries(turn.server).map(([k, v]) => `${k.replace(/_ms$/, "")} ${v} ms`).join(", ") : "";
    parts.push(`<text x="${left - 8}" y="${y0 + (STAGES.length * bar) / 2 + 4}" class="turn" text-anchor="end">turn ${turn.n}` +
      `<title>${escapeHtml(server ? `gateway: ${server}` : "no gateway figures yet")}</title></text>`);
    STAGES.forEach(([stage, , color, meaning], i) => {
      const ms = turn.marks[stage];
      if (ms === undefined) return;
      const shown = `${turn.endEstimated ? "≈" : ""}${ms}`;
      const y = y0 + i * bar;
      parts.push(`<rect class="bar" data-stage="${stage}" x="${left}" y="${y}" width="${Math.max(1, x(ms) - left).toFixed(1)}" ` +
        `height="${bar - 1}" fill="${color}"><title>${meaning}: ${shown} ms</title></rect>`,
        `<text x="${x(ms) + 3}" y="${y + bar - 2}" class="value">${shown}</text>`);
    });
  });
  if (!turns.length) parts.push(`<text x="${left}" y="${top + 10}" class="tick">no turns yet: speak after Start</text>`);
  const chart = $("latency-chart");
  chart.setAttribute("viewBox", `0 0 640 ${axisY + 34}`);
  chart.innerHTML = parts.join("");
}

// 1, 2 or 5 times a power of ten: an axis step a reader can add up.
function niceStep(rough) {
  const power = 10 ** Math.floor(Math.log10(rough));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough);
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
  const instructions = $("instructions").value.trim();
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
        output: { format: { type: "audio/pcm", rate: RATE }, voice: $("voice").value },
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

// --- Microphone --------------------------------------------------------------------------------

// The audio inputs, named once the page has permission (before it, browsers hide the labels).
async function listMicrophones() {
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

// --- Page -------------------------------------------------------------------------------------

// The banner: what answers, as /healthz says (polled while the gateway is still loading its models).
let responderPoll = null;
async function showResponder() {
  clearTimeout(responderPoll);
  let health;
  try {
    health = await (await fetch("/healthz", { cache: "no-store" })).json();
  } catch {
    $("responder").textContent = "The gateway is not answering";
    return;
  }
  stats.authRequired = Boolean(health.auth_required);
  $("api-key").required = stats.authRequired;
  const responder = health.responder;
  stats.responder = responder;
  if (!responder) {
    $("responder").textContent = "The gateway is loading its models…";
    responderPoll = setTimeout(showResponder, 2000);
    return;
  }
  const m = responder.models ?? {};
  const hearing = m.stt ? `, transcripts by ${m.stt}` : "";
  const text = {
    local: () => `Local demo models (${[m.stt, m.llm, m.tts].filter(Boolean).join(", ")})`,
    pipeline: () => `Remote LLM (${m.llm ?? "unnamed model"}), voice by ${m.tts ?? "?"}${hearing}`,
    echo: () => `Echo (repeats you)${hearing}`,
  }[responder.kind];
  $("responder").textContent = text ? text() : `${responder.kind} responder`;
  $("responder").dataset.kind = responder.kind;
}

function setState(state) {
  stats.state = state;
  const live = state === "connected" || state === "connecting";
  $("status").textContent = state;
  $("status").dataset.state = state;
  $("connect").textContent = live ? "Stop" : "Start";
  $("connect").dataset.state = state;
  $("apply").disabled = state !== "connected";
  $("commit").disabled = state !== "connected" || $("vad").checked;
  if (!live) {
    $("mic-name").textContent = "no microphone open";
    $("mic-rate").textContent = "";
  }
  setActivity(state === "connected" ? "listening" : "");
}

function setActivity(text) {
  $("activity").textContent = text;
}

// Errors and notices go to the banner at the top; "warn" for what is not a fault (the server closing).
function showError(text, level = "error") {
  stats.errors.push(text);
  const li = document.createElement("li");
  li.className = level;
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  $("errors").prepend(li);
  $("notice").hidden = false;
}

function escapeHtml(text) {
  return text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

// The key stays in this page's memory unless the user asks to keep it (then localStorage, nowhere else).
const KEY_STORE = "voice-gateway.api-key";
function rememberKey() {
  if ($("remember-key").checked && $("api-key").value) localStorage.setItem(KEY_STORE, $("api-key").value);
  else localStorage.removeItem(KEY_STORE);
}
$("api-key").value = localStorage.getItem(KEY_STORE) ?? "";
$("remember-key").checked = Boolean($("api-key").value);
$("api-key").addEventListener("change", rememberKey);
$("remember-key").addEventListener("change", rememberKey);
$("access").addEventListener("submit", (e) => e.preventDefault());

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
  $("notice").hidden = true;
});
navigator.mediaDevices?.addEventListener?.("devicechange", listMicrophones);
setState("idle");
renderLatency();
listMicrophones();
showResponder();
