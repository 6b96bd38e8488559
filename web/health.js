// What answers, and whether it can: the banner at the top, from /healthz (polled).
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
