// Streamed playback of pcm16 24 kHz with a small jitter buffer, running in a 24 kHz context.
//
// Messages in:  {type: "audio", itemId, samples: Int16Array}  queue audio of an item
//               {type: "end", itemId}                         no more audio for it: play out the rest
//               {type: "flush"}                               stop at once and drop everything
// Messages out: {type: "started", itemId, contextTime}        first sample of an item rendered
//               {type: "finished", itemId, played}            an item played out to its end
//               {type: "flushed", itemId, played, hadAudio}   answer to flush (played: samples heard)
//               {type: "progress", played, underruns}         every ~100 ms while playing

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.prebuffer = options.processorOptions.prebufferSamples;
    this.queue = []; // [{itemId, samples, offset}]
    this.queued = 0; // samples waiting in the queue
    this.ended = new Set(); // items whose last audio is queued
    this.buffering = true; // waiting for the jitter buffer to fill before (re)starting
    this.current = null; // item being played and its played sample count
    this.played = 0; // all samples played, for the page's statistics
    this.underruns = 0;
    this.sinceProgress = 0;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  onMessage(msg) {
    if (msg.type === "audio") {
      this.queue.push({ itemId: msg.itemId, samples: msg.samples, offset: 0 });
      this.queued += msg.samples.length;
    } else if (msg.type === "end") {
      this.ended.add(msg.itemId);
      // The item may have run dry before its end was known: it is over now.
      const rest = this.queue.some((chunk) => chunk.itemId === msg.itemId);
      if (this.current?.itemId === msg.itemId && !rest) this.finish();
    } else if (msg.type === "flush") {
      const hadAudio = this.current !== null || this.queued > 0;
      const itemId = this.current?.itemId ?? this.queue[0]?.itemId ?? null;
      const played = this.current?.played ?? 0;
      this.queue = [];
      this.queued = 0;
      this.ended.clear();
      this.current = null;
      this.buffering = true;
      this.port.postMessage({ type: "flushed", itemId, played, hadAudio });
    }
  }

  // Play once enough is buffered, or when the rest of an item is all there is.
  ready() {
    if (this.queue.length === 0) return false;
    return this.queued >= this.prebuffer || this.ended.has(this.queue[this.queue.length - 1].itemId);
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    let i = 0;
    if (this.buffering && this.ready()) this.buffering = false;
    while (!this.buffering && i < out.length) {
      const head = this.queue[0];
      if (!head) {
        // Underrun: unless the item ended, wait for the buffer to refill instead of stuttering.
        if (this.current && !this.ended.has(this.current.itemId)) this.underruns++;
        this.buffering = true;
        break;
      }
      if (this.current?.itemId !== head.itemId) this.begin(head.itemId, i);
      const n = Math.min(out.length - i, head.samples.length - head.offset);
      for (let k = 0; k < n; k++) out[i + k] = head.samples[head.offset + k] / 32768;
      i += n;
      head.offset += n;
      this.queued -= n;
      this.current.played += n;
      this.played += n;
      if (head.offset === head.samples.length) {
        this.queue.shift();
        if (this.ended.has(head.itemId) && this.queue[0]?.itemId !== head.itemId) this.finish();
      }
    }
    out.fill(0, i);
    this.sinceProgress += out.length;
    if (this.sinceProgress >= sampleRate / 10) {
      this.sinceProgress = 0;
      this.port.postMessage({ type: "progress", played: this.played, underruns: this.underruns });
    }
    return true;
  }

  begin(itemId, offset) {
    if (this.current) this.finish();
    this.current = { itemId, played: 0 };
    this.port.postMessage({ type: "started", itemId, contextTime: currentTime + offset / sampleRate });
  }

  finish() {
    const { itemId, played } = this.current;
    this.ended.delete(itemId);
    this.current = null;
    this.port.postMessage({ type: "finished", itemId, played });
  }
}

registerProcessor("playback", PlaybackProcessor);
