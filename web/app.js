// The page's entry: the tabs, the banner of what answers (health.js), the Access form (access.js), the voice
// menus (voices.js) and the Conversation tab (conversation.js). A new tab is a module beside conversation.js,
// wired here.
import { setUpAccess } from "./access.js";
import {
  applySettings,
  commitTurn,
  connect,
  disconnect,
  hangUpOnLeave,
  listMicrophones,
  live,
  setState,
} from "./conversation.js";
import { $ } from "./dom.js";
import { watchHealth } from "./health.js";
import { renderLatency, watchChartWidth } from "./latency.js";
import { clearNotices } from "./notices.js";
import { setUpTabs } from "./tabs.js";
import { setUpVoices, showConversationVoices } from "./voices.js";

setUpTabs();
setUpAccess();
setUpVoices();
$("connect").addEventListener("click", () => (live() ? disconnect() : connect()));
$("settings").addEventListener("submit", (e) => {
  e.preventDefault();
  applySettings();
});
$("commit").addEventListener("click", commitTurn);
// Closing the tab hangs up at once (WebRTC: the DELETE goes out with keepalive), rather than leaving the
// gateway to notice the silence.
window.addEventListener("pagehide", hangUpOnLeave);
$("clear-errors").addEventListener("click", clearNotices);
navigator.mediaDevices?.addEventListener?.("devicechange", listMicrophones);
setState("idle");
renderLatency();
watchChartWidth();
listMicrophones();
watchHealth((health) => showConversationVoices(health?.responder, health?.auth_required));
