// The Realtime protocol over WebRTC: the microphone and the agent's voice as Opus media tracks,
// events as JSON on the "oai-events" data channel (the same events as over the WebSocket, minus the
// audio appends and deltas). The gateway plays the audio out itself, so barge-in needs nothing from
// the page: the server clears its buffer and truncates the reply where it was heard.
//
// Self-contained: no imports, so it works beside the WebSocket page or on its own.
//
//   const call = await connectWebRTC({ url: location.origin, stream, onEvent });
//   call.send({ type: "response.create" });
//   await call.close();

const GATHER_TIMEOUT_MS = 3000; // a network that never finishes gathering still gets its host candidates
const OPEN_TIMEOUT_MS = 15000;
const HANGUP_TIMEOUT_MS = 2000;

/**
 * Starts a call. Resolves once the data channel is open; rejects (and cleans up) if the offer is
 * refused or the connection does not come up.
 *
 * @param {object} options
 * @param {string} options.url  the gateway's base URL (signalling is on its own port), e.g. "http://host:8000"
 * @param {MediaStream} options.stream  the microphone (its first audio track is sent; not stopped on close)
 * @param {(event: object) => void} [options.onEvent]  every server event, parsed
 * @param {(reason: string) => void} [options.onClose]  called once when the call ends, for any reason
 * @param {HTMLAudioElement} [options.audio]  where the agent's voice plays (a detached one is made if absent)
 * @param {object} [options.session]  session config applied before session.created (GA shape)
 * @param {boolean} [options.beta]  beta signalling (POST /v1/realtime?model=...) and beta-shaped events
 * @param {string} [options.model]  model name for the beta route
 * @param {RTCIceServer[]} [options.iceServers]  none by default: host candidates work on a LAN
 * @param {string} [options.token]  an API key or client secret, sent as Authorization: Bearer
 * @returns {Promise<{send: (event: object) => void, close: () => Promise<void>, pc: RTCPeerConnection,
 *   audio: HTMLAudioElement, callUrl: URL | null}>}
 */
export async function connectWebRTC({
  url,
  stream,
  onEvent = () => {},
  onClose = () => {},
  audio = null,
  session = null,
  beta = false,
  model = "gpt-realtime",
  iceServers = [],
  token = null,
}) {
  const auth = token ? { Authorization: `Bearer ${token}` } : {};
  const pc = new RTCPeerConnection({ iceServers });
  const player = audio ?? new Audio();
  player.autoplay = true;
  let callUrl = null;
  let closed = false;

  const track = stream?.getAudioTracks()[0];
  if (track) pc.addTrack(track, stream);
  else pc.addTransceiver("audio", { direction: "recvonly" });
  pc.ontrack = (e) => {
    player.srcObject = e.streams[0] ?? new MediaStream([e.track]);
    // Autoplay rules may block until a user gesture; the connect button click normally counts.
    player.play().catch(() => {});
  };

  const channel = pc.createDataChannel("oai-events");
  channel.onmessage = (e) => {
    let event;
    try {
      event = JSON.parse(e.data);
    } catch {
      return; // the gateway sends only JSON; anything else is not ours to show
    }
    onEvent(event);
  };

  // hangUp: this page ends the call; a call the gateway or the network ended is gone already, and a DELETE
  // would only meet a 404.
  async function close(reason = "closed", hangUp = true) {
    if (closed) return;
    closed = true;
    if (callUrl && hangUp) {
      // Hang up before closing the connection, so the DELETE finds the call. keepalive: it still
      // goes out when called from pagehide.
      await fetch(callUrl, { method: "DELETE", headers: auth, keepalive: true, signal: AbortSignal.timeout(HANGUP_TIMEOUT_MS) })
        .catch(() => {});
    }
    channel.close();
    pc.close();
    player.srcObject = null;
    onClose(reason);
  }

  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed" || pc.connectionState === "closed") close(`connection ${pc.connectionState}`, false);
  };
  channel.onclose = () => close("data channel closed", false);

  const opened = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("the WebRTC connection did not come up")), OPEN_TIMEOUT_MS);
    channel.addEventListener("open", () => {
      clearTimeout(timer);
      resolve();
    });
  });
  opened.catch(() => {}); // a call closed before it opened must not leave an unhandled rejection

  try {
    await pc.setLocalDescription(await pc.createOffer());
    // The gateway (aiortc) takes no trickled candidates: send the offer with all of them.
    await gathered(pc);
    const offer = pc.localDescription.sdp;
    const base = new URL(url, location.href);
    const endpoint = beta
      ? new URL(`/v1/realtime?model=${encodeURIComponent(model)}`, base)
      : new URL("/v1/realtime/calls", base);
    let init;
    if (session && !beta) {
      const form = new FormData();
      form.set("sdp", offer);
      form.set("session", JSON.stringify(session));
      init = { method: "POST", body: form, headers: auth };
    } else {
      init = { method: "POST", body: offer, headers: { "Content-Type": "application/sdp", ...auth } };
    }
    let response;
    try {
      response = await fetch(endpoint, init);
    } catch (err) {
      throw new Error(`the gateway's WebRTC endpoint ${endpoint} is unreachable (${err.message})`);
    }
    if (response.status !== 201) {
      const text = await response.text();
      let message = text;
      try {
        message = JSON.parse(text).error.message;
      } catch {
        // not the gateway's JSON error: show the body as it came
      }
      throw new Error(`the gateway refused the call (${response.status}): ${message}`);
    }
    const where = response.headers.get("Location");
    callUrl = where ? new URL(where, base) : null;
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    await opened;
  } catch (err) {
    await close(err.message);
    throw err;
  }

  return {
    send(event) {
      if (channel.readyState === "open") channel.send(JSON.stringify(event));
    },
    close: () => close("closed"),
    pc,
    audio: player,
    callUrl,
  };
}

function gathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      pc.removeEventListener("icegatheringstatechange", check);
      clearTimeout(timer);
      resolve();
    };
    const check = () => pc.iceGatheringState === "complete" && done();
    const timer = setTimeout(done, GATHER_TIMEOUT_MS);
    pc.addEventListener("icegatheringstatechange", check);
  });
}
