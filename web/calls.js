// The page's Calls tab: the gateway's phone calls (GET /v1/realtime/calls), pending and answered, refreshed
// every two seconds while the tab is shown; a pending call is accepted (with the instructions typed here) or rejected, an answered
// one hung up, with the Access panel's API key, as an application would over OpenAI's call-control API.
const $ = (id) => document.getElementById(id);

// What the tests read, and the table renders from.
const state = { calls: [], error: null, polls: 0 };
window.__calls = state;

const MARKUP = `
  <section class="calls">
    <h2>Phone calls <small>(SIP and Twilio; POST /v1/realtime/calls/{id}/accept, /reject, /hangup)</small></h2>
    <label class="stack">Instructions for the calls accepted here
      <input id="call-instructions" type="text" value="You answer the phone for us. Be brief and friendly." />
    </label>
    <table>
      <thead><tr><th>Call</th><th>Line</th><th>From</th><th>To</th><th>Status</th><th></th></tr></thead>
      <tbody id="calls-list"></tbody>
    </table>
    <p class="meta" id="calls-note">No calls.</p>
  </section>`;

function headers() {
  const key = $("api-key").value.trim();
  return { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) };
}

async function decide(call, action, body = {}) {
  const reply = await fetch(`/v1/realtime/calls/${encodeURIComponent(call)}/${action}`, {
    method: "POST",
    headers: headers(),
    body: JSON.stringify(body),
  });
  if (!reply.ok) {
    const detail = await reply.json().catch(() => ({}));
    state.error = `${action} failed (${reply.status}): ${detail.error?.message ?? "no details"}`;
  } else {
    state.error = null;
  }
  await refresh();
}

function button(label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.dataset.action = label.toLowerCase().replace(" ", "-");
  b.addEventListener("click", onClick);
  return b;
}

function render() {
  const list = $("calls-list");
  list.replaceChildren();
  for (const call of state.calls) {
    const row = document.createElement("tr");
    row.dataset.call = call.id;
    for (const text of [call.id, call.line, call.from, call.to, call.status]) {
      const cell = document.createElement("td");
      cell.textContent = text ?? "";
      row.append(cell);
    }
    const actions = document.createElement("td");
    if (call.status === "pending") {
      actions.append(
        button("Accept", () =>
          decide(call.id, "accept", { type: "realtime", instructions: $("call-instructions").value }),
        ),
        button("Reject", () => decide(call.id, "reject", { status_code: 603 })),
      );
    } else if (call.status === "answered") {
      actions.append(button("Hang up", () => decide(call.id, "hangup")));
    }
    row.append(actions);
    list.append(row);
  }
  const note = state.error ?? (state.calls.length ? "" : "No calls.");
  $("calls-note").textContent = note;
}

async function refresh() {
  if ($("calls-tab").hidden) return; // polled only while the tab is shown
  try {
    const reply = await fetch("/v1/realtime/calls", { headers: headers() });
    const body = await reply.json().catch(() => ({}));
    if (reply.ok) state.calls = body.data ?? [];
    else state.error = `the calls cannot be listed (${reply.status}): ${body.error?.message ?? "no details"}`;
  } catch {
    state.error = `could not connect to the gateway at ${location.origin}`;
  }
  state.polls += 1;
  render();
}

$("calls-tab").innerHTML = MARKUP;
document.querySelector("#tabs [data-tab='calls']").addEventListener("click", () => setTimeout(refresh));
setInterval(refresh, 2000);
