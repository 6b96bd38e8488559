// Microphone → pcm16 24 kHz chunks. Runs on the audio thread at the context's own rate (browsers
// differ on whether a microphone may feed a context of another rate), so it resamples here.
import { StreamResampler } from "./resampler.js";

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { targetRate, chunkMs } = options.processorOptions;
    this.resampler = new StreamResampler(sampleRate, targetRate);
    this.chunkSize = (targetRate * chunkMs) / 1000;
    this.chunk = new Int16Array(this.chunkSize);
    this.fill = 0;
  }

  process(inputs) {
    const channel = inputs[0][0]; // absent until the track delivers audio
    if (!channel) return true;
    for (const sample of this.resampler.process(channel)) {
      const s = Math.max(-1, Math.min(1, sample));
      this.chunk[this.fill++] = s < 0 ? s * 0x8000 : s * 0x7fff;
      if (this.fill === this.chunkSize) {
        this.port.postMessage(this.chunk, [this.chunk.buffer]); // transferred: no copy, but detached
        this.chunk = new Int16Array(this.chunkSize);
        this.fill = 0;
      }
    }
    return true;
  }
}

registerProcessor("capture", CaptureProcessor);
