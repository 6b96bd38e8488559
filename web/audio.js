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

// Starts the microphone; onChunk receives Int16Array chunks of 24 kHz mono. Returns {stop()}.
export async function startMicrophone(onChunk) {
  requireSecureContext();
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
    });
  } catch (err) {
    throw new Error(`microphone unavailable: ${err.name === "NotAllowedError" ? "permission denied" : err.message}`);
  }
  // The device's own rate: Firefox refuses a microphone in a context of another rate.
  const context = new AudioContext();
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
    await context.resume();
  } catch (err) {
    stream.getTracks().forEach((t) => t.stop());
    await context.close();
    throw err;
  }
  return {
    rate: context.sampleRate,
    stop() {
      stream.getTracks().forEach((t) => t.stop());
      context.close();
    },
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
