// Everything worth observing, kept in one place: the panels render from it and the tests read it
// (window.__gateway).

export const stats = {
  state: "idle", // idle | connecting | connected | closed (the server or the network ended it)
  activity: "", // listening | you are speaking | thinking… | assistant speaking
  events: {}, // server event type → count
  sentAppends: 0,
  speechStarted: 0,
  speechStopped: 0,
  receivedSamples: 0,
  playedSamples: 0,
  underruns: 0,
  bargeIns: 0,
  truncates: [], // {item_id, audio_end_ms} as sent
  turns: [], // {n, itemId, responseId, speechEndAt, endEstimated, heardMs, server, marks}
  errors: [], // the notices shown, in order
  levelPeak: 0, // the loudest the meter showed (0..1 RMS)
  health: null, // the last /healthz answer
  responder: null, // its "responder": what answers
  authRequired: false,
};
window.__gateway = stats;
