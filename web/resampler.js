// Streaming windowed-sinc resampler (mono float32), used inside the capture worklet.
// State is carried between calls, so any chunking gives the same output: resampling each
// render quantum on its own would click at every boundary.

const ZERO_CROSSINGS = 16; // kernel half-width in output-rate zero crossings: ~0.7 ms of delay
const TABLE_STEPS = 512; // kernel samples per input sample, linearly interpolated

export class StreamResampler {
  constructor(inRate, outRate) {
    this.step = inRate / outRate;
    this.passthrough = inRate === outRate;
    // Keep 95% of the lower Nyquist so the transition band ends before aliasing starts.
    const cutoff = Math.min(1, outRate / inRate) * 0.95;
    this.half = Math.ceil(ZERO_CROSSINGS / cutoff);
    this.table = kernelTable(cutoff, this.half);
    // History starts as `half` zeros so the first output sample lines up with the first input.
    this.buf = new Float32Array(4096);
    this.len = this.half;
    this.pos = this.half; // position of the next output sample, in input samples into buf
  }

  process(input) {
    if (this.passthrough) return Float32Array.from(input);
    this.append(input);
    const out = new Float32Array(Math.ceil(input.length / this.step) + 2);
    let n = 0;
    const { buf, half, table } = this;
    while (Math.floor(this.pos) + half < this.len) {
      const base = Math.floor(this.pos);
      const frac = this.pos - base;
      let acc = 0;
      for (let k = 1 - half; k <= half; k++) {
        const x = Math.abs(k - frac) * TABLE_STEPS;
        const i = Math.floor(x);
        const w = table[i] + (table[i + 1] - table[i]) * (x - i);
        acc += buf[base + k] * w;
      }
      out[n++] = acc;
      this.pos += this.step;
    }
    this.discard(Math.floor(this.pos) - half + 1);
    return out.subarray(0, n);
  }

  append(input) {
    if (this.len + input.length > this.buf.length) {
      const bigger = new Float32Array(2 * (this.len + input.length));
      bigger.set(this.buf.subarray(0, this.len));
      this.buf = bigger;
    }
    this.buf.set(input, this.len);
    this.len += input.length;
  }

  discard(count) {
    if (count <= 0) return;
    this.buf.copyWithin(0, count, this.len);
    this.len -= count;
    this.pos -= count;
  }
}

// Lowpass kernel cutoff·sinc(cutoff·x) under a Blackman window, for |x| in [0, half] input samples.
function kernelTable(cutoff, half) {
  const size = half * TABLE_STEPS + 2;
  const table = new Float32Array(size);
  for (let i = 0; i < size; i++) {
    const x = i / TABLE_STEPS;
    if (x >= half) break;
    const sinc = x === 0 ? 1 : Math.sin(Math.PI * cutoff * x) / (Math.PI * cutoff * x);
    const r = 0.5 + x / (2 * half); // window position: 0.5 at the center, 1 at the edge
    const blackman = 0.42 - 0.5 * Math.cos(2 * Math.PI * r) + 0.08 * Math.cos(4 * Math.PI * r);
    table[i] = cutoff * sinc * blackman;
  }
  return table;
}
