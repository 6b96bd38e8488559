// Microphone capture and streamed playback, both as AudioWorklets, plus pcm16 ⇄ base64.

export const RATE = 24000; // the protocol's pcm16 rate
const CHUNK_MS = 20; // one input_audio_buffer.append per 20 ms of speech
const PREBUFFER_MS = 80; // jitter buffer: audio held before playback starts or resumes

export function encodePcm16(samples) {
  const bytes = new Uint8Array(samples.buffer, samples.byteOffset, samples.byteLength);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

export function decodePcm16(base64) {
  const binary = atob(base64);
  const bytes = new Uint8Array(binary.length & ~1);
  for (let i = 0; i < bytes.length; i++) bytes[i] = binary.charCodeAt(i);
  return new Int16Array(bytes.buffer);
}

function requireSecureContext() {
  if (!window.isSecureContext || !navigator.mediaDevices || !window.AudioWorkletNode) {
    throw new Error(
      "the microphone and audio worklets need a secure context: open the page via https:// " +
        "or http://localhost / http://127.0.0.1",
    );
  }
}

// Starts the microphone (`deviceId`: one of enumerateDevices' audio inputs, or null for the default);
// onChunk receives Int16Array chunks of 24 kHz mono. Returns {rate, label, deviceId, level(), stop()}.
export async function startMicrophone(onChunk, deviceId = null) {
  const stream = await openMicrophone(deviceId, { channelCount: 1 });
  // The device's own rate: Firefox refuses a microphone in a context of another rate.
  const context = new AudioContext();
  let level;
  try {
    await context.audioWorklet.addModule(new URL("./capture-worklet.js", import.meta.url));
    const source = context.createMediaStreamSource(stream);
    const node = new AudioWorkletNode(context, "capture", {
      numberOfInputs: 1,
      numberOfOutputs: 0,
      channelCount: 1,
      channelCountMode: "explicit", // downmix a stereo microphone
      processorOptions: { targetRate: RATE, chunkMs: CHUNK_MS },
    });
    node.port.onmessage = (e) => onChunk(e.data);
    source.connect(node);
    level = levelOf(context, source);
    await context.resume();
  } catch (err) {
    stream.getTracks().forEach((t) => t.stop());
    await context.close();
    throw err;
  }
  return {
    rate: context.sampleRate,
    ...describe(stream),
    level,
    stop() {
      stream.getTracks().forEach((t) => t.stop());
      context.close();
    },
  };
}

// The microphone as a MediaStream (WebRTC sends it itself), with its level meter.
// Returns {stream, label, deviceId, level(), stop()}.
export async function openMeteredMicrophone(deviceId = null) {
  const stream = await openMicrophone(deviceId);
  const context = new AudioContext();
  const level = levelOf(context, context.createMediaStreamSource(stream));
  await context.resume();
  return {
    stream,
    ...describe(stream),
    level,
    stop() {
      stream.getTracks().forEach((t) => t.stop());
      context.close();
    },
  };
}

async function openMicrophone(deviceId, extra = {}) {
  requireSecureContext();
  const audio = { echoCancellation: true, noiseSuppression: true, autoGainControl: true, ...extra };
  if (deviceId) audio.deviceId = { exact: deviceId };
  try {
    return await navigator.mediaDevices.getUserMedia({ audio });
  } catch (err) {
    const why = err.name === "NotAllowedError" ? "permission denied"
      : err.name === "OverconstrainedError" ? "the chosen device is gone" : err.message;
    throw new Error(`microphone unavailable: ${why}`);
  }
}

function describe(stream) {
  const track = stream.getAudioTracks()[0];
  return { label: track?.label || "microphone", deviceId: track?.getSettings().deviceId ?? null };
}

// The input level for the meter: the RMS (0..1) of the last ~20 ms. The analyser feeds a muted gain to
// the destination: Chromium only runs nodes that lead somewhere.
function levelOf(context, source) {
  const analyser = context.createAnalyser();
  analyser.fftSize = 1024;
  const mute = context.createGain();
  mute.gain.value = 0;
  source.connect(analyser).connect(mute).connect(context.destination);
  const samples = new Float32Array(analyser.fftSize);
  return () => {
    analyser.getFloatTimeDomainData(samples);
    let sum = 0;
    for (const x of samples) sum += x * x;
    return Math.sqrt(sum / samples.length);
  };
}

// The playback side: a 24 kHz context (the browser resamples to the device) and the worklet.
// onMessage receives the worklet's reports (see playback-worklet.js), with `heardAt` added to
// "started": the performance.now() time at which that first sample reaches the speaker.
export class Player {
  static async create(onMessage) {
    requireSecureContext();
    const context = new AudioContext({ sampleRate: RATE, latencyHint: "interactive" });
    try {
      await context.audioWorklet.addModule(new URL("./playback-worklet.js", import.meta.url));
      const node = new AudioWorkletNode(context, "playback", {
        numberOfInputs: 0,
        outputChannelCount: [1],
        processorOptions: { prebufferSamples: (RATE * PREBUFFER_MS) / 1000 },
      });
      node.connect(context.destination);
      await context.resume();
      return new Player(context, node, onMessage);
    } catch (err) {
      context.close();
      throw err;
    }
  }

  constructor(context, node, onMessage) {
    this.context = context;
    this.node = node;
    this.flushWaiters = []; // the worklet answers flushes in order
    node.port.onmessage = (e) => {
      const msg = e.data;
      if (msg.type === "started") msg.heardAt = this.heardAt(msg.contextTime);
      if (msg.type === "flushed") this.flushWaiters.shift()?.(msg);
      onMessage(msg);
    };
  }

  push(itemId, samples) {
    this.node.port.postMessage({ type: "audio", itemId, samples }, [samples.buffer]);
  }

  end(itemId) {
    this.node.port.postMessage({ type: "end", itemId });
  }

  // Stops playback at once; resolves to {itemId, played (samples), hadAudio}.
  flush() {
    return new Promise((resolve) => {
      this.flushWaiters.push(resolve);
      this.node.port.postMessage({ type: "flush" });
    });
  }

  // Maps a context time to performance.now() time at the speaker, using the output timestamp
  // (which accounts for output latency) when the browser provides one.
  heardAt(contextTime) {
    const ts = this.context.getOutputTimestamp?.();
    if (ts && ts.performanceTime > 0) return ts.performanceTime + (contextTime - ts.contextTime) * 1000;
    return performance.now() + (this.context.outputLatency || 0) * 1000;
  }

  close() {
    this.context.close();
  }
}
