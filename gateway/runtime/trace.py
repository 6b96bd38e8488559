"""Per-turn latency trace: timestamps of each stage, as JSON lines and Prometheus histograms.

A turn runs from the user's end of speech (speech_stopped, or the commit or response.create that
started the response) to its response.done. Stages are measured from that start, on the event
loop's clock, when the session or the responder reaches them. A record also has that start itself
(``at_ms``, the loop's clock: the host's monotonic one, which a client on the same host shares) and,
for a turn ended by speech_stopped, where in the input audio the speech ended (``audio_end_ms``): a
client that knows when it sent each moment of its audio can tell how late the turn was detected.
A phone call's records carry its ``call_id`` and its line's own id of it (``line_call_id``: SIP's
Call-ID, Twilio's CallSid), so the phone's side and the trunk's logs can be matched to them.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

STAGES = (
    "committed", "stt_done", "llm_first_token", "llm_first_segment", "tts_first_audio", "first_delta",
    "response_done",
)
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5, 0.75, 1, 2.5, 5, 10)

TURN_STAGE = Histogram(
    "gateway_turn_stage_seconds", "Time from the end of the user's turn to each stage of the response",
    ["stage"], buckets=_BUCKETS,
)
CANCEL_TO_DONE = Histogram(
    "gateway_cancel_to_done_seconds", "Barge-in or response.cancel to the cancelled response's response.done",
    buckets=_BUCKETS,
)
CANCEL_TO_LAST_DELTA = Histogram(
    "gateway_cancel_to_last_delta_seconds", "Cancel to the last audio delta sent for that response",
    buckets=_BUCKETS,
)
RESPONSES = Counter("gateway_responses_total", "Responses by final status", ["status"])
# livesum: under `serve --workers N` (prometheus_client's multiprocess mode) the sum over the live workers.
ACTIVE_SESSIONS = Gauge("gateway_active_sessions", "Open Realtime sessions", multiprocess_mode="livesum")
# Capacity, set at each scrape from gateway.runtime.capacity (every worker process's sessions): what a balancer or
# an autoscaler acts on.
SESSIONS = Gauge("gateway_sessions", "Sessions the gateway holds (every worker process)",
                 multiprocess_mode="mostrecent")
SESSION_SLOTS_FREE = Gauge("gateway_session_slots_free", "Sessions the gateway may still take ([server] max_sessions)",
                           multiprocess_mode="mostrecent")
DRAINING = Gauge("gateway_draining", "1 while the gateway drains (takes no new session)", multiprocess_mode="max")
# Only with an engine that has a stream cap (qwen3): a registry of its own, left out of /metrics otherwise.
ENGINE_REGISTRY = CollectorRegistry(auto_describe=True)
ENGINE_STREAMS_FREE = Gauge("gateway_engine_streams_free", "TTS engine streams free: the engines' rows less the "
                            "streams they hold or queue", registry=ENGINE_REGISTRY, multiprocess_mode="mostrecent")


def metrics_text(engine_streams: bool) -> bytes:
    """/metrics: this process's metrics, or under `serve --workers N` (prometheus_client's multiprocess mode:
    its files in PROMETHEUS_MULTIPROC_DIR) every worker's, added up; gateway_engine_streams_free only when
    `engine_streams` (an engine with a stream cap)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return generate_latest() + (generate_latest(ENGINE_REGISTRY) if engine_streams else b"")
    registry = CollectorRegistry()
    registry.register(_AllWorkers(engine_streams))
    return generate_latest(registry)


class _AllWorkers(Collector):
    """Every worker's metrics files, added up (the engine's stream gauge has a file even when unused)."""

    def __init__(self, engine_streams: bool) -> None:
        self.files = MultiProcessCollector(None)
        self.engine_streams = engine_streams

    def collect(self) -> Any:
        return [m for m in self.files.collect() if self.engine_streams or m.name != "gateway_engine_streams_free"]


_DELTAS = ("response.output_audio.delta", "response.audio.delta")


@dataclass
class _Run:
    """One response's timings, from the start of its turn (loop time)."""

    start: float
    times: dict[str, float] = field(default_factory=dict)
    audio_end_ms: float | None = None  # speech_stopped's, when the turn ended with it
    cancel: float | None = None
    last_delta: float | None = None
    status: str = "completed"


class TurnTrace:
    """A session's responses, each timed on its own (out-of-band ones may run beside the conversation's).

    A response's start is the end of the turn it answers (speech_stopped, else the commit) when one came
    since the last response started, else its own response.created."""

    def __init__(self, session_id: str, sink: IO[str] | None = None, tags: dict[str, str] | None = None) -> None:
        """``tags``: fields every record of the session carries (a phone call's ids)."""
        self.session_id = session_id
        self.sink = sink
        self.tags = tags or {}
        self._turn: _Run | None = None  # the last turn's end, until a response takes it
        self._running: dict[str, _Run] = {}
        self.records: deque[dict[str, Any]] = deque(maxlen=100)  # served at /v1/realtime/sessions/{id}/turns

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def mark(self, name: str, response_id: str | None = None) -> None:
        now = self._now()
        if response_id is None:  # the turn's own stages
            if name == "speech_stopped" or self._turn is None:
                self._turn = _Run(now)
            self._turn.times.setdefault(name, now)
            return
        if name == "response_created":
            self._running[response_id] = self._turn or _Run(now)
            self._turn = None
        elif name == "response_done":
            if (run := self._running.pop(response_id, None)) is not None:
                self._finish(run, now, response_id)
        elif (run := self._running.get(response_id)) is not None:
            run.times.setdefault(name, now)

    def moment(self, name: str) -> None:
        """A session's event outside the turns' stages (a Live delegation created, a commentary appended, its
        speech's first audio): a record of its own, at loop time ``at_ms``, for the figures that span turns."""
        record = {"session_id": self.session_id, **self.tags, "event": name, "at_ms": round(self._now() * 1000, 3)}
        self.records.append(record)
        if self.sink is not None:
            self.sink.write(json.dumps(record) + "\n")

    def cancelled(self, response_id: str) -> None:
        if (run := self._running.get(response_id)) is not None:
            run.cancel = self._now()

    def sent(self, event: dict[str, Any]) -> None:
        if event["type"] == "input_audio_buffer.speech_stopped":
            if self._turn is not None:
                self._turn.audio_end_ms = event["audio_end_ms"]
        elif event["type"] in _DELTAS:
            if (run := self._running.get(event["response_id"])) is not None:
                run.last_delta = self._now()
        elif event["type"] == "response.done":
            if (run := self._running.get(event["response"]["id"])) is not None:
                run.status = event["response"]["status"]

    def _finish(self, run: _Run, now: float, response_id: str) -> None:
        record: dict[str, Any] = {"session_id": self.session_id, **self.tags, "response_id": response_id,
                                  "at_ms": round(run.start * 1000, 3)}
        if run.audio_end_ms is not None:
            record["audio_end_ms"] = run.audio_end_ms
        run.times["response_done"] = now
        for stage in STAGES:
            if stage in run.times:
                seconds = run.times[stage] - run.start
                record[stage + "_ms"] = round(seconds * 1000, 3)
                TURN_STAGE.labels(stage).observe(seconds)
        if run.cancel is not None:
            record["cancel_to_done_ms"] = round((now - run.cancel) * 1000, 3)
            CANCEL_TO_DONE.observe(now - run.cancel)
            after = max(0.0, (run.last_delta or 0.0) - run.cancel)
            record["cancel_to_last_delta_ms"] = round(after * 1000, 3)
            CANCEL_TO_LAST_DELTA.observe(after)
        record["status"] = run.status
        RESPONSES.labels(run.status).inc()
        self.records.append(record)
        if self.sink is not None:
            self.sink.write(json.dumps(record) + "\n")
