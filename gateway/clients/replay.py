"""Headless replay: one Realtime session per WAV file, all at once, with per-turn latency reports.

    python -m gateway replay --url ws://127.0.0.1:8000/v1/realtime --out DIR a.wav b.wav ...
    python -m gateway replay --transport webrtc [--signalling-url URL] --out DIR a.wav b.wav ...

Each WAV is split into turns at silences (``--split-silence-ms``). A turn is streamed like a
microphone would (paced at ``--speed`` × real time), followed by silence so server VAD ends it.
Over WebSocket the reply is "played" on a simulated clock running at the same speed; once it has
played out and ``--turn-gap-ms`` has passed, the next turn starts. With ``--barge-in-ms`` the next
turn starts instead when that much of the reply has played, and when the server reports the new
speech the client stops its playback and sends conversation.item.truncate with what was heard, as
a real client does.

Over WebRTC (``--transport webrtc``: Opus audio, real time only) the server plays the reply out: it
is heard as it arrives on the track, it has played out at output_audio_buffer.stopped, and on a
barge-in the server clears its playout and truncates the reply itself (the client sends no truncate).

Written per session, in DIR/<wav name>/: output.wav (every reply's audio as received),
events.jsonl (every event sent and received, with times; audio reduced to its size) and
latency.json (per turn: speech_stopped → first reply audio, → response.done, barge-in
speech_started → response.done), plus latency.png when matplotlib is installed. DIR/summary.json
collects the sessions and the SHA-256 of each output.wav: over WebSocket, with the echo responder,
or a model with a fixed seed and greedy decoding, the same WAVs give the same hashes (barge-in runs
excepted when the reply streams in real time, since how much of it is sent before the cancel depends
on timing). Over WebRTC the audio is Opus-coded, so its hashes differ from WebSocket's; see README.md
for how stable they are from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from gateway.audio import SAMPLE_RATE
from gateway.clients import connection
from gateway.clients.cli import CHUNK_MS, DEFAULT_URL, TAIL_MS, TurnTracker, read_wav, strip_audio, write_wav
from gateway.clients.connect import check_transport, open_connection
from gateway.clients.connection import (
    TRANSPORTS,
    CliError,
    Connection,
    ConnectionLost,
    Endpoint,
    ReplyAudio,
    endpoint_from,
)

FRAME = SAMPLE_RATE * 20 // 1000  # 20 ms analysis frames for splitting turns
SPEECH_DB_BELOW_PEAK = 30.0  # a frame this far below the loudest one counts as silence
MIN_SPEECH_MS = 100  # shorter bursts (clicks) do not make a turn
NO_SPEECH_WAIT_S = 1.5  # after a turn is sent, how long to wait for speech_started before giving up
BARGE_IN_LEAD_MS = 100  # lead-in kept before the speech of a turn that interrupts a reply
MAX_WAIT_S = 0.05  # longest sleep between checks when no event or playback point is due


@dataclass
class Options:
    out: Path
    url: str = DEFAULT_URL
    speed: float = 1.0
    turn_gap_ms: int = 1000
    barge_in_ms: list[int | None] = field(default_factory=list)
    split_silence_ms: int = 800
    tail_ms: int = TAIL_MS
    turn_timeout_s: float = 30.0
    beta: bool = False
    transport: str = "websocket"
    signalling_url: str | None = None  # WebRTC: None derives it from ``url``
    api_key: str | None = None

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.url, self.transport, self.signalling_url, self.api_key, self.beta)

    def barge_in_for(self, reply: int) -> int | None:
        """Barge-in point for the reply to turn ``reply`` (0-based); one value applies to all."""
        if not self.barge_in_ms:
            return None
        if len(self.barge_in_ms) == 1:
            return self.barge_in_ms[0]
        return self.barge_in_ms[reply] if reply < len(self.barge_in_ms) else None


# --- Turns --------------------------------------------------------------------------------------


@dataclass
class TurnAudio:
    samples: np.ndarray
    onset: int  # sample where its speech begins (0 when unknown)


def split_turns(samples: np.ndarray, split_silence_ms: int) -> list[TurnAudio]:
    """Cut a recording into turns at silences of at least ``split_silence_ms``.

    The cuts fall in the middle of each such silence, so every turn keeps its own lead-in and
    trailing quiet. A file with no clear speech stays one turn and the server decides.
    """
    n = len(samples) // FRAME
    if n == 0:
        return [TurnAudio(samples, 0)]
    frames = samples[: n * FRAME].astype(np.float64).reshape(n, FRAME)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    voiced = rms > rms.max() * 10 ** (-SPEECH_DB_BELOW_PEAK / 20) if rms.max() > 0 else np.zeros(n, bool)
    runs: list[list[int]] = []  # [first, last + 1] frame of each stretch of speech
    for i in np.flatnonzero(voiced):
        if runs and (i - runs[-1][1]) * 20 < split_silence_ms:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    runs = [r for r in runs if (r[1] - r[0]) * 20 >= MIN_SPEECH_MS]
    if not runs:
        return [TurnAudio(samples, 0)]
    cuts = [(a[1] + b[0]) // 2 * FRAME for a, b in zip(runs, runs[1:], strict=False)]
    bounds = [0, *cuts, len(samples)]
    return [
        TurnAudio(samples[a:b], run[0] * FRAME - a) for a, b, run in zip(bounds[:-1], bounds[1:], runs, strict=True)
    ]


@dataclass
class TurnReport:
    turn: int
    queued_s: float | None = None  # wall time (since connecting) when the turn was queued to send
    user_item_id: str | None = None
    response_id: str | None = None
    responses: int = 0
    status: str | None = None
    speech_started_s: float | None = None
    speech_end_s: float | None = None  # when the last sample of the user's speech (audio_end_ms) was sent
    speech_stopped_s: float | None = None  # when speech_stopped arrived (after the VAD's silence)
    first_audio_s: float | None = None
    response_done_s: float | None = None
    reply_audio_ms: float = 0.0
    played_ms: float | None = None
    truncated_at_ms: int | None = None
    barge_in_s: float | None = None  # the next turn's speech_started that interrupted this reply
    outcome: str = "pending"  # answered | interrupted | no response | no speech detected | timeout | connection lost

    def latencies(self) -> dict[str, float | None]:
        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round((b - a) * 1000, 1)

        barge = ms(self.barge_in_s, self.response_done_s)
        return {
            # What a user waits: from the end of their speech, the VAD's silence included.
            "speech_end_to_first_audio_ms": ms(self.speech_end_s, self.first_audio_s),
            "speech_stopped_to_first_audio_ms": ms(self.speech_stopped_s, self.first_audio_s),
            "speech_stopped_to_response_done_ms": ms(self.speech_stopped_s, self.response_done_s),
            # None when the response had already finished streaming and only playback was stopped
            "barge_in_to_response_done_ms": barge if barge is not None and barge >= 0 else None,
        }


# --- Simulated listener -------------------------------------------------------------------------


class Playback:
    """What a listener hears: each reply item played from its first audio.

    Over WebSocket the client plays it, on the simulated clock: playback stalls when the audio received
    so far has all been played (an underrun), and ends once the response is done and everything
    received has been played. With ``server_playout`` (WebRTC) the server plays it: the audio is heard
    as it arrives on the track, and playback ends with output_audio_buffer.stopped or .cleared.
    """

    def __init__(self, server_playout: bool = False) -> None:
        self.server_playout = server_playout
        self.item_id: str | None = None
        self.response_id: str | None = None
        self.received_ms = 0.0
        self.played_ms = 0.0
        self.streaming = False
        self._last: float | None = None

    def advance(self, now_ms: float) -> None:
        if self._last is not None and self.item_id is not None:
            elapsed = self.received_ms if self.server_playout else self.played_ms + now_ms - self._last
            self.played_ms = min(self.received_ms, elapsed)
        self._last = now_ms

    def feed(self, response_id: str, item_id: str, ms: float, now_ms: float) -> None:
        self.advance(now_ms)
        if item_id != self.item_id:
            self.item_id, self.response_id = item_id, response_id
            self.received_ms = self.played_ms = 0.0
            self.streaming = True
        self.received_ms += ms

    def response_done(self, response_id: str) -> None:
        if response_id == self.response_id and not self.server_playout:
            self.streaming = False

    def playout_ended(self, response_id: str | None) -> None:
        """The server stopped (``response_id``) or cleared (None) its playout."""
        if self.server_playout and response_id in (None, self.response_id):
            self.streaming = False

    def active(self, now_ms: float) -> bool:
        self.advance(now_ms)
        return self.item_id is not None and (self.streaming or self.played_ms < self.received_ms)

    def stop(self) -> tuple[str | None, float]:
        """Stop at once (barge-in): the item that was playing and how much of it was heard."""
        heard = (self.item_id, self.played_ms)
        self.item_id = self.response_id = None
        self.streaming = False
        return heard


# --- One session --------------------------------------------------------------------------------


class ReplaySession:
    def __init__(self, wav: Path, out_dir: Path, options: Options) -> None:
        self.wav = wav
        self.out_dir = out_dir
        self.options = options
        self.turns: list[TurnReport] = []
        self.reply = bytearray()
        self.errors: list[str] = []
        server_playout = options.transport == "webrtc"
        self.tracker = TurnTracker(server_playout)
        self.playback = Playback(server_playout)
        self.by_response: dict[str, TurnReport] = {}
        self.played_of: dict[str, TurnReport] = {}  # assistant item → the turn it answers
        self.conn: Connection | None = None
        self.log: TextIO | None = None
        self.t0 = 0.0
        self.mic = bytearray()  # audio waiting to be sent, as by a microphone
        self.mic_ready = asyncio.Event()
        self.mic_idle = asyncio.Event()
        self.sha256 = ""

    # Clocks: wall seconds since connecting (for latencies), and simulated milliseconds, which
    # run ``speed`` times faster (for the audio timeline and the listener's playback).
    def now(self) -> float:
        return time.monotonic() - self.t0

    def sim_ms(self) -> float:
        return self.now() * 1000 * self.options.speed

    @property
    def current(self) -> TurnReport | None:
        return self.turns[-1] if self.turns else None

    async def run(self, samples: np.ndarray) -> None:
        """Converse, then write output.wav, latency.json (and latency.png) into ``out_dir``."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        turns = split_turns(samples, self.options.split_silence_ms)
        if len(turns) == 1 and self.options.barge_in_for(0) is not None:
            turns = [turns[0], turns[0]]  # one turn: its copy is the speech that interrupts the reply
        with open(self.out_dir / "events.jsonl", "w") as log:
            self.log = log
            self.conn = await open_connection(
                self.options.endpoint, self.options.speed, on_send=lambda event: self._log("send", event)
            )
            self.t0 = time.monotonic()
            receiver = asyncio.create_task(self._receive())
            sender = asyncio.create_task(self._send_microphone())
            try:
                await self._converse(turns)
            finally:
                sender.cancel()
                await self.conn.close()
                await asyncio.gather(receiver, sender, return_exceptions=True)
        write_wav(self.out_dir / "output.wav", bytes(self.reply))
        self.sha256 = hashlib.sha256((self.out_dir / "output.wav").read_bytes()).hexdigest()
        self._write_report()

    async def _converse(self, turns: list[TurnAudio]) -> None:
        tail = np.zeros(SAMPLE_RATE * self.options.tail_ms // 1000, dtype=np.int16)
        lead = SAMPLE_RATE * BARGE_IN_LEAD_MS // 1000
        interrupting = False
        for index, audio in enumerate(turns):
            turn = TurnReport(turn=index + 1, queued_s=round(self.now(), 4))
            self.turns.append(turn)
            if interrupting:
                # The user talks now: the rest of the previous turn's trailing silence and most of
                # this turn's lead-in are skipped, so the speech starts at the barge-in point.
                del self.mic[:]
                self.mic.extend(audio.samples[max(0, audio.onset - lead) :].tobytes())
            else:
                self.mic.extend(audio.samples.tobytes())
            self.mic.extend(tail.tobytes())
            self.mic_idle.clear()
            self.mic_ready.set()
            barge_in = self.options.barge_in_for(index) if index + 1 < len(turns) else None
            turn.outcome = await self._await_reply(turn, barge_in)
            if turn.outcome in ("no speech detected", "no response"):
                self.errors.append(f"turn {turn.turn}: {turn.outcome}")
            interrupting = turn.outcome == "interrupted"
            if turn.outcome == "connection lost":
                return
            if turn.outcome == "answered" and index + 1 < len(turns):
                await asyncio.sleep(self.options.turn_gap_ms / 1000 / self.options.speed)

    async def _await_reply(self, turn: TurnReport, barge_in: int | None) -> str:
        """Wait until the reply to ``turn`` has played, or reached the barge-in point.

        Wakes on every server event, and otherwise exactly when the simulated playback reaches
        the point it is waiting for, so many sessions do not poll.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.turn_timeout_s
        idle_since: float | None = None
        while True:
            if self.tracker.closed:
                self.errors.append("connection closed by the server")
                return "connection lost"
            playback = self.playback
            playing = playback.active(self.sim_ms())
            ours = playing and self.played_of.get(playback.item_id or "") is turn
            if barge_in is not None and ours and playback.played_ms >= barge_in:
                return "interrupted"
            started = turn.speech_started_s is not None
            if started and self.tracker.quiet and not playing:
                return "answered" if turn.response_id else "no response"
            wait = MAX_WAIT_S
            if playing:
                target = min(barge_in, playback.received_ms) if barge_in is not None and ours else playback.received_ms
                if target > playback.played_ms:  # else stalled: the next delta is an event and wakes us
                    wait = min(wait, (target - playback.played_ms) / 1000 / self.options.speed)
            if self.mic_idle.is_set() and not started:
                idle_since = idle_since or loop.time()
                if loop.time() - idle_since > NO_SPEECH_WAIT_S:
                    return "no speech detected"
            if loop.time() > deadline:
                self.errors.append(f"turn {turn.turn}: no complete reply within {self.options.turn_timeout_s} s")
                return "timeout"
            self.tracker.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.tracker.changed.wait(), wait)

    async def _send_microphone(self) -> None:
        """Stream the queued audio in CHUNK_MS pieces, paced by the connection like a microphone."""
        assert self.conn is not None
        step = SAMPLE_RATE * CHUNK_MS // 1000 * 2
        while True:
            await self.mic_ready.wait()
            while self.mic:
                chunk = bytes(self.mic[:step])
                del self.mic[:step]
                try:
                    await self.conn.send_audio(chunk)
                except ConnectionLost:
                    return  # the receiver sees the end too
            self.mic_ready.clear()
            self.mic_idle.set()

    async def _send_event(self, event: dict[str, Any]) -> None:
        assert self.conn is not None
        await self.conn.send(event)

    async def _receive(self) -> None:
        assert self.conn is not None
        async for item in self.conn:
            if isinstance(item, ReplyAudio):
                self._on_audio(item)
            else:
                self._log("recv", item)
                await self._on_event(item)
        self.tracker.close()

    async def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        self.tracker.update(event)
        t = round(self.now(), 4)
        turn = self.current
        if kind == "input_audio_buffer.speech_started" and turn is not None:
            if turn.speech_started_s is None:
                turn.speech_started_s = t
                turn.user_item_id = event.get("item_id")
            if self.playback.active(self.sim_ms()):
                await self._barge_in(t)
        elif kind == "input_audio_buffer.speech_stopped" and turn is not None:
            turn.speech_stopped_s = t
            assert self.conn is not None
            sent = self.conn.sent_at(event.get("audio_end_ms", 0))
            if sent is not None:
                turn.speech_end_s = round(sent - self.t0, 4)
        elif kind == "response.created" and turn is not None:
            response_id = event["response"]["id"]
            turn.response_id = response_id
            turn.responses += 1
            self.by_response[response_id] = turn
        elif kind == "response.done":
            response = event["response"]
            answered = self.by_response.get(response["id"])
            self.playback.response_done(response["id"])
            if answered is not None:
                answered.response_done_s = t
                answered.status = response.get("status")
        elif kind == "output_audio_buffer.stopped":
            self.playback.playout_ended(event.get("response_id"))
        elif kind == "output_audio_buffer.cleared":
            self.playback.playout_ended(None)
        elif kind == "conversation.item.truncated" and self.playback.server_playout:
            # The server truncated the reply where its playout was (the client does it over WebSocket).
            truncated = self.played_of.get(event.get("item_id", ""))
            if truncated is not None:
                truncated.truncated_at_ms = event.get("audio_end_ms")
        elif kind == "error":
            err = event.get("error") or {}
            self.errors.append(f"{err.get('code') or err.get('type')}: {err.get('message')}")

    def _on_audio(self, audio: ReplyAudio) -> None:
        self.reply.extend(audio.pcm)
        self.tracker.changed.set()  # the barge-in point may have been reached
        answered = self.by_response.get(audio.response_id or "")
        if answered is None:
            return
        ms = len(audio.pcm) / 2 * 1000 / SAMPLE_RATE
        answered.reply_audio_ms += ms
        if answered.first_audio_s is None:
            answered.first_audio_s = round(self.now(), 4)
        if answered.barge_in_s is None:  # audio after a barge-in is never played
            item_id = audio.item_id or audio.response_id or ""
            self.played_of[item_id] = answered
            self.playback.feed(audio.response_id or "", item_id, ms, self.sim_ms())

    async def _barge_in(self, t: float) -> None:
        """New speech while a reply plays: stop listening to it, and (when the client plays the audio)
        tell the server what was heard; with server playout the server truncates it itself."""
        item_id, played_ms = self.playback.stop()
        answered = self.played_of.get(item_id or "")
        if item_id is None or answered is None:
            return
        answered.barge_in_s = t
        if self.playback.server_playout:
            return
        answered.played_ms = round(played_ms, 1)
        answered.truncated_at_ms = int(played_ms)
        await self._send_event(
            {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": int(played_ms),
            }
        )

    def _log(self, direction: str, event: dict[str, Any]) -> None:
        if self.log is not None:
            line = {"t": round(self.now(), 4), "dir": direction, "event": strip_audio(event)}
            self.log.write(json.dumps(line) + "\n")

    def _write_report(self) -> None:
        for turn in self.turns:
            if turn.played_ms is None and turn.first_audio_s is not None:
                turn.played_ms = round(turn.reply_audio_ms, 1)  # not interrupted: heard to the end
        report = {
            "wav": str(self.wav),
            "url": self.options.endpoint.address,
            "transport": self.options.transport,
            "speed": self.options.speed,
            "output_wav": "output.wav",
            "output_sha256": self.sha256,
            "output_audio_ms": round(len(self.reply) / 2 * 1000 / SAMPLE_RATE, 1),
            "errors": self.errors,
            "turns": [{**asdict(turn), **turn.latencies()} for turn in self.turns],
        }
        (self.out_dir / "latency.json").write_text(json.dumps(report, indent=2) + "\n")
        plot(self.out_dir / "latency.png", self.wav.name, self.turns)


# --- Output -------------------------------------------------------------------------------------


def plot(path: Path, title: str, turns: list[TurnReport]) -> bool:
    """Bar chart of the turns' latencies, when matplotlib is installed (optional dependency)."""
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        return False
    names = list(turns[0].latencies()) if turns else []
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / max(1, len(names))
    for k, name in enumerate(names):
        values = [turn.latencies()[name] or 0 for turn in turns]
        offset = (k - (len(names) - 1) / 2) * width
        ax.bar([t.turn + offset for t in turns], values, width, label=name.removesuffix("_ms"))
    ax.set_xlabel("turn")
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.set_xticks([t.turn for t in turns])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _cell(value: float | int | str | None) -> str:
    return "-" if value is None else f"{value:.0f}" if isinstance(value, float) else str(value)


def print_table(sessions: list[ReplaySession], out: TextIO = sys.stdout) -> None:
    header = ("session", "turn", "outcome", "status", "end→audio", "stop→audio", "stop→done", "barge→done", "reply",
              "heard")
    rows = [header]
    for s in sessions:
        for turn in s.turns:
            lat = turn.latencies()
            rows.append(
                (
                    s.out_dir.name,
                    str(turn.turn),
                    turn.outcome,
                    turn.status or "-",
                    _cell(lat["speech_end_to_first_audio_ms"]),
                    _cell(lat["speech_stopped_to_first_audio_ms"]),
                    _cell(lat["speech_stopped_to_response_done_ms"]),
                    _cell(lat["barge_in_to_response_done_ms"]),
                    _cell(turn.reply_audio_ms),
                    _cell(turn.played_ms),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out)
    print("(ms; end→audio: from the end of the user's speech to the first reply audio, the VAD's silence\n"
          " included; stop→: from speech_stopped's arrival; barge→done: new speech_started to the interrupted\n"
          " reply's response.done; reply/heard: reply audio received / heard before any barge-in)", file=out)
    for s in sessions:
        print(f"{s.out_dir.name}: output.wav sha256 {s.sha256}", file=out)


async def replay(wavs: list[Path], options: Options) -> list[ReplaySession]:
    """Run one session per WAV file concurrently; write each one's files and DIR/summary.json."""
    check_transport(options.transport)
    if options.transport == "webrtc" and options.speed != 1:
        raise CliError("--speed must be 1 over WebRTC: its audio runs at real time")
    loaded = [(wav, read_wav(wav)) for wav in wavs]  # bad files fail before anything connects
    try:
        options.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {options.out}: {exc.strerror or exc}") from None
    names: dict[str, int] = {}
    sessions = []
    for wav, _ in loaded:
        names[wav.stem] = names.get(wav.stem, 0) + 1
        name = wav.stem if names[wav.stem] == 1 else f"{wav.stem}-{names[wav.stem]}"
        sessions.append(ReplaySession(wav, options.out / name, options))
    results = await asyncio.gather(
        *(session.run(samples) for session, (_, samples) in zip(sessions, loaded, strict=True)),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result
    summary = {
        "url": options.endpoint.address,
        "transport": options.transport,
        "speed": options.speed,
        "sessions": [
            {
                "wav": str(s.wav),
                "dir": s.out_dir.name,
                "output_sha256": s.sha256,
                "turns": len(s.turns),
                "errors": s.errors,
            }
            for s in sessions
        ],
    }
    (options.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return sessions


# --- Command line -------------------------------------------------------------------------------


def _barge_in_list(text: str) -> list[int | None]:
    values: list[int | None] = []
    for part in text.split(","):
        part = part.strip()
        values.append(None if part in ("", "-", "none") else _milliseconds(part))
    return values


def _milliseconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of milliseconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: milliseconds cannot be negative")
    return value


def _positive_ms(text: str) -> int:
    value = _milliseconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 ms")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replay WAV files as concurrent headless sessions (one per file; turns split at silences), with "
        "simulated playback and optional barge-in; writes output audio, event logs and latency reports."
    )
    parser.epilog = (
        "Exit status: 0 when every turn of every session was answered (or interrupted as asked); 1 when a "
        "session had a problem (no speech detected, no response, a timeout, an error event, the connection "
        "lost), listed in its latency.json; 2 for bad arguments or files, or a gateway that cannot be reached."
    )
    parser.add_argument("wavs", nargs="+", type=Path, metavar="WAV",
                        help="WAV files (PCM or float, any rate and channels), one session each")
    parser.add_argument("--out", required=True, type=Path, help="folder for the per-session results")
    parser.add_argument(
        "--speed", type=_positive, default=1.0, help="audio and playback clock speed, × real time (default 1)"
    )
    parser.add_argument(
        "--turn-gap-ms", type=_milliseconds, default=1000, help="pause after a reply has played, before the next turn"
    )
    parser.add_argument(
        "--barge-in-ms",
        type=_barge_in_list,
        default=[],
        help="start the next turn when this much of a reply has played; one value for all replies or a "
        "comma list per reply ('-' for none); a one-turn WAV is sent twice so the copy interrupts",
    )
    parser.add_argument("--split-silence-ms", type=_positive_ms, default=800,
                        help="silence that separates turns within a WAV")
    parser.add_argument(
        "--tail-ms", type=_milliseconds, default=TAIL_MS, help="silence sent after each turn so server VAD ends it"
    )
    parser.add_argument("--turn-timeout", type=_positive, default=30.0, help="seconds to wait for a reply (default 30)")
    parser.add_argument("--transport", choices=TRANSPORTS, default="websocket",
                        help="websocket (default), or webrtc: Opus audio at real time, the server plays the replies "
                        "out and truncates them on barge-in (needs the webrtc extra)")
    connection.add_arguments(parser, DEFAULT_URL)


def run(args: argparse.Namespace) -> int:
    endpoint = endpoint_from(args, args.transport)
    options = Options(
        out=args.out,
        url=endpoint.url,
        speed=args.speed,
        turn_gap_ms=args.turn_gap_ms,
        barge_in_ms=args.barge_in_ms,
        split_silence_ms=args.split_silence_ms,
        tail_ms=args.tail_ms,
        turn_timeout_s=args.turn_timeout,
        beta=endpoint.beta,
        transport=endpoint.transport,
        signalling_url=endpoint.signalling_url,
        api_key=endpoint.api_key,
    )
    try:
        sessions = asyncio.run(replay(args.wavs, options))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print_table(sessions)
    print(f"results in {options.out}/")
    return 1 if any(s.errors for s in sessions) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway replay")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
