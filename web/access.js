// The Access form: an API key or a client secret, for every tab that opens a session or calls the API.
import { $ } from "./dom.js";

const KEY_STORE = "voice-gateway.api-key";

// What a session connects with: a client secret as given, or one minted with the API key (so the
// long-lived key never rides in a WebSocket header), or nothing on an open gateway.
export async function sessionCredential() {
  const key = $("api-key").value.trim();
  if (!key || key.startsWith("ek_")) return key || null;
  let reply;
  try {
    reply = await fetch("/v1/realtime/client_secrets", {
      method: "POST",
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
      body: JSON.stringify({ session: { type: "realtime" } }),
    });
  } catch {
    throw new Error(`could not connect to the gateway at ${location.origin}`);
  }
  const body = await reply.json().catch(() => ({}));
  if (!reply.ok) throw new Error(`the API key was refused (${reply.status}): ${body.error?.message ?? "no details"}`);
  return body.value;
}

// The key stays in this page's memory unless the user asks to keep it (then localStorage, nowhere else).
export function setUpAccess() {
  const remember = () => {
    if ($("remember-key").checked && $("api-key").value) localStorage.setItem(KEY_STORE, $("api-key").value);
    else localStorage.removeItem(KEY_STORE);
  };
  $("api-key").value = localStorage.getItem(KEY_STORE) ?? "";
  $("remember-key").checked = Boolean($("api-key").value);
  $("api-key").addEventListener("change", remember);
  $("remember-key").addEventListener("change", remember);
  $("access").addEventListener("submit", (e) => e.preventDefault());
}
