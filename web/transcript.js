// Both sides' words as a chat: one row per conversation item, updated while it streams.
import { $ } from "./dom.js";

const entries = new Map(); // item id → {el, text}

export function entry(itemId, role) {
  let e = entries.get(itemId);
  if (!e) {
    const el = document.createElement("li");
    el.className = role;
    el.innerHTML = `<span class="who">${role === "user" ? "You" : "Assistant"}</span><span class="text"></span>`;
    $("transcript").append(el);
    e = { el, text: "" };
    entries.set(itemId, e);
  }
  return e;
}

export function known(itemId) {
  return entries.get(itemId);
}

export function setText(itemId, role, text) {
  const e = entry(itemId, role);
  if (e.heard !== undefined) return; // cut at what was heard: later text is what nobody heard
  e.text = text ?? "";
  e.el.querySelector(".text").textContent = e.text || "(audio)";
  e.el.classList.remove("pending");
  e.el.scrollIntoView({ block: "nearest" });
}

export function appendText(itemId, role, delta) {
  setText(itemId, role, entry(itemId, role).text + (delta ?? ""));
}

// An interrupted reply: the words the listener heard (the gateway's truncated transcript) as they are, the
// rest of what was generated greyed out.
export function showHeard(itemId, heard) {
  const e = entries.get(itemId);
  if (!e?.text) return; // no words to divide (the echo's audio)
  const full = e.text;
  heard = (heard ?? "").trim();
  const rest = full.startsWith(heard) ? full.slice(heard.length) : full;
  e.heard = heard;
  const text = e.el.querySelector(".text");
  text.replaceChildren();
  const said = document.createElement("span");
  said.className = "heard";
  said.textContent = heard;
  const unheard = document.createElement("span");
  unheard.className = "unheard";
  unheard.title = "Generated, never heard: the reply was interrupted here";
  unheard.textContent = rest;
  text.append(said, unheard);
  e.el.classList.add("interrupted");
}

export function note(itemId, text) {
  const e = entries.get(itemId);
  if (!e) return;
  const small = document.createElement("small");
  small.textContent = text;
  e.el.append(small);
}
