// The latency chart: per turn, one bar per milestone after the end of the user's speech, from what the page saw
// and the gateway's own trace (GET /v1/realtime/sessions/{id}/turns).
import { $, escapeHtml } from "./dom.js";
import { stats } from "./state.js";

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

export function turnOf(responseId) {
  return stats.turns.find((t) => t.responseId === responseId);
}

// Records a milestone the first time the turn reaches it.
export function mark(turn, stage, at = performance.now()) {
  if (!turn || stage in turn.marks) return;
  turn.marks[stage] = Math.max(0, Math.round(at - turn.speechEndAt));
  renderLatency();
}

// The gateway's own timings of a turn, from its trace: each stage in ms after the end of the user's speech.
const SERVER_STAGES = ["stt_done_ms", "llm_first_token_ms", "tts_first_audio_ms", "first_delta_ms"];

export async function fetchServerLatency(sessionId, credential, responseId) {
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

// The chart: per turn, one bar per milestone from the end of speech, on one axis in ms. Drawn at the width it
// is shown at, one unit a CSS pixel, so that its text keeps its size on a phone; the legend wraps to fit.
const LEGEND_ITEM = 108; // px: a swatch and the longest label ("turn detected")
let drawnWidth = 0;

export function renderLatency() {
  const chart = $("latency-chart");
  const measured = chart.getBoundingClientRect().width;
  const chartWidth = Math.round(measured || drawnWidth || 640); // a hidden tab keeps the width it had
  drawnWidth = chartWidth;
  const turns = stats.turns.slice(-CHART_TURNS);
  const perRow = Math.max(1, Math.floor(chartWidth / LEGEND_ITEM));
  const legendRows = Math.ceil(STAGES.length / perRow);
  const [left, bar, gap] = [56, 14, 10];
  const top = legendRows * 20 + 12;
  const width = chartWidth - left - 40; // the rest: the longest bar's value
  const groupHeight = STAGES.length * bar + gap;
  // With no turns yet, one empty row says so, clear of the axis' labels.
  const axisY = top + Math.max(1, turns.length) * groupHeight + 4;
  const highest = Math.max(500, ...turns.flatMap((t) => Object.values(t.marks)));
  const step = niceStep(highest / (chartWidth < 480 ? 3 : 5));
  const max = Math.ceil(highest / step) * step;
  const x = (ms) => left + (ms / max) * width;
  const parts = [];
  // The grid first: the bars are drawn over it.
  for (let ms = 0; ms <= max; ms += step) {
    parts.push(`<line x1="${x(ms)}" x2="${x(ms)}" y1="${top - 4}" y2="${axisY}" class="grid"/>`,
      `<text x="${x(ms)}" y="${axisY + 16}" text-anchor="middle" class="tick">${ms}</text>`);
  }
  parts.push(`<text x="${left + width}" y="${axisY + 34}" text-anchor="end" class="tick">ms after the end of your speech</text>`);
  STAGES.forEach(([, label, color, meaning], i) => {
    const lx = (i % perRow) * LEGEND_ITEM;
    const ly = Math.floor(i / perRow) * 20 + 4;
    parts.push(`<g><title>${meaning}</title><rect x="${lx}" y="${ly + 2}" width="11" height="11" fill="${color}"/>`,
      `<text x="${lx + 16}" y="${ly + 12}" class="legend">${label}</text></g>`);
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
        `<text x="${x(ms) + 3}" y="${y + bar - 3}" class="value">${shown}</text>`);
    });
  });
  if (!turns.length) { // over the grid, on a ground of its own
    parts.push(`<rect x="${left + 1}" y="${top + groupHeight / 2 - 14}" width="${width - 2}" height="20" fill="white"/>`,
      `<text x="${left + 6}" y="${top + groupHeight / 2}" class="tick">no turns yet: speak after Start</text>`);
  }
  chart.setAttribute("viewBox", `0 0 ${chartWidth} ${axisY + 40}`);
  chart.innerHTML = parts.join("");
}

// Drawn again when its width changes (a phone turned, a window resized, its tab shown).
export function watchChartWidth() {
  new ResizeObserver(() => {
    const shown = Math.round($("latency-chart").getBoundingClientRect().width);
    if (shown && shown !== drawnWidth) renderLatency();
  }).observe($("latency-chart"));
}

// 1, 2 or 5 times a power of ten: an axis step a reader can add up.
function niceStep(rough) {
  const power = 10 ** Math.floor(Math.log10(rough));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough);
}
