// The notice banner under the header: errors and warnings, each shown once.
import { $ } from "./dom.js";
import { stats } from "./state.js";

const REPEAT_MS = 3000; // the same failure told twice within this (an error event, then its response.done)

let last = { key: null, at: 0 };

// Shows `text` in the banner; "warn" for what is not a fault (the server closing). `key` names the failure
// itself: a second notice with the same key soon after the first is the same failure told again, not shown.
export function showNotice(text, { level = "error", key = text } = {}) {
  const now = performance.now();
  if (key === last.key && now - last.at < REPEAT_MS) return;
  last = { key, at: now };
  stats.errors.push(text);
  const li = document.createElement("li");
  li.className = level;
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  $("errors").prepend(li);
  $("notice").hidden = false;
}

export function clearNotices() {
  $("errors").replaceChildren();
  $("notice").hidden = true;
}
