// What answers, and whether it can: the banner at the top, from /healthz (polled), and the voice menu, which
// offers only the voices the configured speech engine can tell apart.
import { $, escapeHtml } from "./dom.js";
import { stats } from "./state.js";

const POLL_MS = 10_000;
const STARTING_POLL_MS = 2_000;
const ROLES = { stt: "STT", llm: "LLM", tts: "TTS" };

let timer = null;
const listeners = [];

// Keeps the banner current; calls `onChange(health)` at each answer (null: the gateway is not answering).
export function watchHealth(onChange = null) {
  if (onChange) listeners.push(onChange);
  if (timer === null) refreshHealth();
}

export async function refreshHealth() {
  clearTimeout(timer);
  let health = null;
  try {
    health = await (await fetch("/healthz", { cache: "no-store" })).json();
  } catch {
    // not answering: said in the banner
  }
  stats.health = health;
  render(health);
  for (const listener of listeners) listener(health);
  timer = setTimeout(refreshHealth, health?.responder ? POLL_MS : STARTING_POLL_MS);
  return health;
}

function render(health) {
  const name = $("responder-name");
  if (!health) {
    name.textContent = "The gateway is not answering";
    $("responder").dataset.kind = "down";
    $("backends").replaceChildren();
    return;
  }
  stats.authRequired = Boolean(health.auth_required);
  $("api-key").required = stats.authRequired;
  const responder = health.responder;
  stats.responder = responder;
  if (!responder) {
    name.textContent = "The gateway is loading its models…";
    return;
  }
  name.textContent = {
    local: "Local demo models",
    pipeline: "LLM server",
    echo: "Echo (repeats you)",
  }[responder.kind] ?? `${responder.kind} responder`;
  $("responder").dataset.kind = health.status === "degraded" ? "degraded" : responder.kind;
  const backends = health.backends ?? {};
  $("backends").innerHTML = Object.entries(responder.models ?? {})
    .map(([role, model]) => chip(role, model, backends[role]))
    .join("");
  renderVoices(responder);
}

// One backend: its role and model, and whether it answered its last check.
function chip(role, model, backend) {
  const state = backend?.reachable === false ? "down" : backend?.reachable ? "up" : "unchecked";
  const where = backend?.remote ? "a server" : "in this process";
  const details = [`${ROLES[role] ?? role}: ${model}, ${where}`];
  if (backend?.latency_ms != null && backend.remote) details.push(`answered its last check in ${backend.latency_ms} ms`);
  if (backend?.last_error) details.push(`last error: ${backend.last_error}`);
  const problem = state === "down" ? `: unreachable (${backend.last_error})` : "";
  return `<li data-role="${role}" data-state="${state}" title="${escapeHtml(details.join("; "))}">` +
    `${ROLES[role] ?? role} ${escapeHtml(model)}${escapeHtml(problem)}</li>`;
}

// The voice menu: the engine's voices, or one entry saying there is no choice to make.
function renderVoices(responder) {
  const select = $("voice");
  const voices = responder.voices;
  const chosen = select.value;
  if (Array.isArray(voices) && voices.length) {
    if (select.dataset.offered === voices.join()) return;
    select.replaceChildren(...voices.map((v) => new Option(v, v)));
    if (voices.includes(chosen)) select.value = chosen;
    select.dataset.offered = voices.join();
    select.disabled = false;
    select.title = "";
    return;
  }
  const only = responder.kind === "echo" ? "your own voice (echo)" : `${responder.models?.tts ?? "the engine"}: one voice`;
  select.replaceChildren(new Option(only, ""));
  select.dataset.offered = "";
  select.disabled = true;
  select.title = "The configured speech engine has one voice: every name sounds the same";
}
