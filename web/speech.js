// The page's Speech tab: /v1/audio/speech streamed into the player as it is made (first-byte time shown),
// in one of the gateway's voices or a custom one (the menu is voices.js's, as the Conversation tab's), with
// instructions where the engine follows them; and a custom voice made here: the speaker's consent recorded in
// the browser, then a sample of their voice (or, with a VoiceDesign checkpoint, a voice from a description),
// where the gateway has what that needs, else the tab says what it lacks. Uses the Access panel's API key.
import { Player, RATE } from "./audio.js";
import { $ } from "./dom.js";
import { api, fillMenu, loadVoices, onVoices, refreshCustomVoices, requested } from "./voices.js";

// What the tests read, and the panel renders from.
const state = {
  capabilities: null, // /v1/audio/capabilities
  voices: [], // the custom voices (GET /v1/audio/voices)
  firstByteMs: null, // the last request's time to its first audio bytes
  totalMs: null,
  bytes: 0,
  played: 0, // samples the player played
  spoken: 0, // requests that completed
  created: [], // voices made on this page
  errors: [],
};
window.__speech = state;

const MARKUP = `
  <section class="speak">
    <h2>Text to speech <small>(POST /v1/audio/speech, streamed)</small></h2>
    <label class="stack">Text
      <textarea id="speech-text" rows="4">Hello! This is the gateway's speech endpoint, streaming as it speaks.</textarea>
    </label>
    <div class="row">
      <label>Voice <select id="speech-voice"></select></label>
      <label class="grow" id="speech-instructions-label" hidden>Instructions
        <input id="speech-instructions" type="text" placeholder="e.g. cheerful, a little faster" />
      </label>
      <button id="speech-speak" type="button">Speak</button>
    </div>
    <p class="meta"><span id="speech-model"></span> <span id="speech-timing"></span></p>
  </section>
  <section class="make">
    <h2>Make a voice</h2>
    <p class="meta" id="speech-make-note"></p>
    <label>Name <input id="voice-name" type="text" value="My voice" /></label>
    <label>Language <select id="consent-language"></select></label>
    <p class="phrase">Read aloud: <q id="consent-phrase"></q></p>
    <div class="row">
      <button id="record-consent" type="button" data-what="consent">Record consent</button>
      <span id="consent-status" class="meta">no recording</span>
    </div>
    <div class="row">
      <button id="record-sample" type="button" data-what="sample">Record a sample</button>
      <span id="sample-status" class="meta">no recording (speak naturally, up to 30 s)</span>
    </div>
    <button id="create-voice" type="button" disabled>Create voice</button>
    <div id="design" hidden>
      <label class="stack">Or describe a voice
        <input id="design-prompt" type="text" placeholder="A warm, low voice, speaking calmly" />
      </label>
      <button id="design-voice" type="button">Design voice</button>
    </div>
    <ul id="custom-voices"></ul>
  </section>`;

const recordings = { consent: null, sample: null }; // Blobs
let recorder = null; // the MediaRecorder running, with what it records
let player = null;

function fail(err) {
  state.errors.push(err.message);
  const li = document.createElement("li");
  li.className = "error";
  li.textContent = `${new Date().toLocaleTimeString()} ${err.message}`;
  $("errors").prepend(li);
  $("notice").hidden = false;
}

// --- Speaking --------------------------------------------------------------------------------------

async function speak() {
  const voice = $("speech-voice").value;
  const body = {
    model: "tts-1",
    input: $("speech-text").value,
    voice: requested(voice),
    response_format: "pcm",
    stream_format: "audio",
  };
  const instructions = $("speech-instructions").value.trim();
  if (instructions && state.capabilities?.instructions) body.instructions = instructions;
  $("speech-speak").disabled = true;
  $("speech-timing").textContent = "…";
  const itemId = `speech-${performance.now()}`;
  const started = performance.now();
  state.firstByteMs = state.totalMs = null;
  state.bytes = 0;
  try {
    player ??= await Player.create((msg) => {
      if (msg.type === "progress" || msg.type === "finished") state.played = msg.played;
    });
    const reply = await api("/audio/speech", {
      method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" },
    });
    const reader = reply.body.getReader();
    let odd = null; // a byte of a sample cut between two chunks
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      if (state.firstByteMs === null) {
        state.firstByteMs = performance.now() - started;
        $("speech-timing").textContent = `first byte after ${state.firstByteMs.toFixed(0)} ms`;
      }
      state.bytes += value.length;
      let bytes = value;
      if (odd !== null) bytes = Uint8Array.of(odd, ...value);
      odd = bytes.length % 2 ? bytes[bytes.length - 1] : null;
      const samples = new Int16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + (bytes.length & ~1)));
      if (samples.length) player.push(itemId, samples);
    }
    player.end(itemId);
    state.totalMs = performance.now() - started;
    state.spoken += 1;
    const seconds = state.bytes / 2 / RATE;
    $("speech-timing").textContent =
      `first byte after ${state.firstByteMs?.toFixed(0) ?? "-"} ms; ${seconds.toFixed(1)} s of audio in ` +
      `${state.totalMs.toFixed(0)} ms`;
  } catch (err) {
    $("speech-timing").textContent = "";
    fail(err);
  } finally {
    $("speech-speak").disabled = false;
  }
}

// --- Voices ----------------------------------------------------------------------------------------

// The tab as the gateway's voices and capabilities make it (voices.js calls it whenever they change).
function render({ capabilities: caps, custom }) {
  if (!caps) return;
  const first = state.capabilities === null;
  state.capabilities = caps;
  state.voices = custom;
  fillMenu($("speech-voice"));
  renderCustomVoices(custom);
  if (!first) return;
  $("speech-model").textContent = `Speaking with ${caps.model}.`;
  $("speech-instructions-label").hidden = !caps.instructions;
  $("design").hidden = !caps.design;
  const languages = $("consent-language");
  languages.replaceChildren(...Object.keys(caps.consent_phrases).map((code) => new Option(code, code)));
  languages.value = "en";
  showPhrase();
  // Making a voice: what cannot work here is off, and the note says what the gateway lacks for it.
  for (const id of ["consent-language", "record-consent", "record-sample"]) $(id).disabled = !caps.cloning;
  $("voice-name").disabled = !caps.cloning && !caps.design;
  const lacks = (what) => `it lacks ${what.join(" and ")}`;
  $("speech-make-note").textContent = caps.cloning
    ? `Record the speaker reading the consent phrase, then a sample of their voice (at most ${caps.limits.max_sample_seconds} s).`
    : `This gateway cannot clone a voice: ${lacks(caps.missing.cloning)}.` +
      (caps.design ? "" : ` Nor design one from a description: ${lacks(caps.missing.design)}.`);
}

function showPhrase() {
  $("consent-phrase").textContent = state.capabilities?.consent_phrases[$("consent-language").value] ?? "";
}

function renderCustomVoices(custom) {
  $("custom-voices").replaceChildren(...custom.map((v) => {
    const li = document.createElement("li");
    li.textContent = `${v.name} `;
    const small = document.createElement("small");
    small.textContent = v.id;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "Delete";
    remove.addEventListener("click", () => deleteVoice(v.id).catch(fail));
    li.append(small, " ", remove);
    return li;
  }));
}

async function deleteVoice(id) {
  await api(`/audio/voices/${encodeURIComponent(id)}`, { method: "DELETE" });
  await refreshCustomVoices();
}

async function toggleRecording(what) {
  const button = $(`record-${what}`);
  if (recorder?.what === what) {
    recorder.media.stop();
    return;
  }
  if (recorder) return; // one recording at a time
  const stream = await navigator.mediaDevices.getUserMedia({ audio: { echoCancellation: false, noiseSuppression: false } });
  const media = new MediaRecorder(stream);
  const chunks = [];
  const started = performance.now();
  media.ondataavailable = (e) => chunks.push(e.data);
  media.onstop = () => {
    stream.getTracks().forEach((t) => t.stop());
    recordings[what] = new Blob(chunks, { type: media.mimeType });
    const seconds = (performance.now() - started) / 1000;
    $(`${what}-status`).textContent = `${seconds.toFixed(1)} s recorded (${media.mimeType})`;
    button.textContent = what === "consent" ? "Record consent again" : "Record a sample again";
    recorder = null;
    $("create-voice").disabled = !(recordings.consent && recordings.sample);
  };
  recorder = { what, media };
  media.start();
  button.textContent = "Stop";
  $(`${what}-status`).textContent = "recording…";
}

function extension(blob) {
  return blob.type.includes("ogg") ? "ogg" : blob.type.includes("mp4") ? "mp4" : "webm";
}

async function createVoice() {
  $("create-voice").disabled = true;
  try {
    const consent = new FormData();
    consent.append("name", $("voice-name").value);
    consent.append("language", $("consent-language").value);
    consent.append("recording", recordings.consent, `consent.${extension(recordings.consent)}`);
    const made = await (await api("/audio/voice_consents", { method: "POST", body: consent })).json();
    const voice = new FormData();
    voice.append("name", $("voice-name").value);
    voice.append("consent", made.id);
    voice.append("audio_sample", recordings.sample, `sample.${extension(recordings.sample)}`);
    const created = await (await api("/audio/voices", { method: "POST", body: voice })).json();
    state.created.push(created.id);
    await refreshCustomVoices();
    $("speech-voice").value = created.id;
  } catch (err) {
    fail(err);
  } finally {
    $("create-voice").disabled = !(recordings.consent && recordings.sample);
  }
}

async function designVoice() {
  try {
    const created = await (await api("/audio/voices", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ type: "prompt", name: $("voice-name").value, prompt: $("design-prompt").value }),
    })).json();
    state.created.push(created.id);
    await refreshCustomVoices();
    $("speech-voice").value = created.id;
  } catch (err) {
    fail(err);
  }
}

// --- The tab ---------------------------------------------------------------------------------------

$("speech-tab").innerHTML = MARKUP;
onVoices(render);
// tabs.js shows the panel; the first showing loads what it lists (voices.js loads it again when the key changes).
document.querySelector("#tabs [data-tab='speech']").addEventListener("click", () => loadVoices().catch(fail));
$("speech-speak").addEventListener("click", speak);
$("consent-language").addEventListener("change", showPhrase);
$("record-consent").addEventListener("click", () => toggleRecording("consent").catch(fail));
$("record-sample").addEventListener("click", () => toggleRecording("sample").catch(fail));
$("create-voice").addEventListener("click", createVoice);
$("design-voice").addEventListener("click", designVoice);
