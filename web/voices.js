// The gateway's voices, one list for both tabs' menus: GET /v1/audio/capabilities' distinct_voices (one entry
// per voice that sounds different: the names that select the same voice are one entry, and an engine that
// speaks every name alike is one voice) and the deployment's custom voices (GET /v1/audio/voices). Both need
// an API key on a gateway with keys: the Access form's.
import { $ } from "./dom.js";

// What the menus render from (the tests read it too).
export const voices = { capabilities: null, custom: [], problem: null };
window.__voices = voices;

const listeners = new Set();
let loading = null;

// Headers with the Access form's key, if one is given.
export function authorized(headers = {}) {
  const key = $("api-key")?.value.trim();
  return key ? { Authorization: `Bearer ${key}`, ...headers } : headers;
}

// fetch(`/v1${path}`) with the Access form's key; an error answer becomes an Error that says it.
export async function api(path, options = {}) {
  const reply = await fetch(`/v1${path}`, { ...options, headers: authorized(options.headers) });
  if (!reply.ok) {
    const body = await reply.json().catch(() => ({}));
    const param = body.error?.param ? ` (${body.error.param})` : "";
    throw new Error(`${path}: ${reply.status} ${body.error?.message ?? reply.statusText}${param}`);
  }
  return reply;
}

// Calls `render(voices)` whenever the lists change (now, if they are loaded).
export function onVoices(render) {
  listeners.add(render);
  if (voices.capabilities) render(voices);
}

// Loads the lists, once: again only after the key changes (a refusal is kept until then, not asked again
// at every health poll).
export function loadVoices() {
  loading ??= (async () => {
    voices.capabilities = await (await api("/audio/capabilities")).json();
    voices.problem = null;
    await refreshCustomVoices();
  })().catch((err) => {
    voices.problem = err.message;
    for (const render of listeners) render(voices);
    throw err;
  });
  return loading;
}

// The custom voices again (one was made or deleted): every menu shows the change.
export async function refreshCustomVoices() {
  voices.custom = (await (await api("/audio/voices")).json()).data;
  for (const render of listeners) render(voices);
}

export function setUpVoices() {
  $("api-key").addEventListener("change", () => {
    loading = null;
    loadVoices().catch(() => {}); // said by each menu (voices.problem)
  });
}

// An engine voice as a menu shows it: the names that select it, then who speaks them ("coral, marin (serena)").
export function label(voice) {
  if (voice.names === null) return voice.speaker;
  const names = voice.names.filter((name) => name !== voice.speaker);
  return names.length ? `${names.join(", ")} (${voice.speaker})` : voice.speaker;
}

// Fills a <select> with the voices, keeping its choice where it is still offered; off when there is only
// one voice to have.
export function fillMenu(select) {
  const chosen = select.value;
  const engine = voices.capabilities.distinct_voices.map((voice) => {
    const option = new Option(label(voice), voice.voice);
    option.dataset.names = (voice.names ?? []).join(",");
    return option;
  });
  const custom = document.createElement("optgroup");
  custom.label = "Custom voices";
  custom.append(...voices.custom.map((v) => new Option(`${v.name} (${v.type === "prompt" ? "designed" : "cloned"})`, v.id)));
  select.replaceChildren(...engine, ...(voices.custom.length ? [custom] : []));
  if (chosen) chooseVoice(select, chosen);
  const anyName = voices.capabilities.distinct_voices.some((voice) => voice.names === null);
  select.disabled = select.options.length < 2;
  select.title = !select.disabled ? "" : anyName
    ? "The speech engine has one voice: every voice name sounds the same"
    : "The speech engine has one voice";
}

// Shows the menu's entry for `voice` (a name, a custom voice's id, or {id}), if it offers one.
export function chooseVoice(select, voice) {
  const wanted = String(typeof voice === "object" ? voice?.id : voice).toLowerCase();
  const option = [...select.options].find((o) => o.value.toLowerCase() === wanted ||
    (o.dataset.names ?? "").split(",").includes(wanted));
  if (option) select.value = option.value;
}

// A menu's value as a request names it: a custom voice by id, an engine voice by name.
export function requested(value) {
  return value.startsWith("voice_") ? { id: value } : value;
}

// The Conversation tab's menu: the echo's own voice, or the gateway's voices once listed (on a gateway with
// keys, once the Access form has one: asking without would only be refused).
export function showConversationVoices(responder, authRequired = false) {
  const select = $("voice");
  if (!responder) return;
  if (responder.kind === "echo") {
    listeners.delete(renderConversationMenu);
    select.replaceChildren(new Option("your own voice (echo)", ""));
    select.disabled = true;
    select.title = "The echo has no voice of its own: you hear yourself";
    return;
  }
  if (!listeners.has(renderConversationMenu)) onVoices(renderConversationMenu);
  if (authRequired && !$("api-key").value.trim()) {
    renderConversationMenu();
    return;
  }
  loadVoices().catch(() => {}); // said in the menu (voices.problem)
}

function renderConversationMenu() {
  const select = $("voice");
  if (voices.capabilities && !voices.problem) {
    fillMenu(select);
    return;
  }
  select.replaceChildren(new Option("the gateway's default", ""));
  select.disabled = true;
  select.title = `The voices cannot be listed: ${voices.problem ?? "not yet"}. An API key (Access) lists them.`;
}
