"""Terminal client: stream a WAV file (or the microphone) to a Realtime endpoint and save the reply.

    python -m gateway client [--url ws://127.0.0.1:8000/v1/realtime] [--wav in.wav] [--out reply.wav] [--beta]
                             [--webrtc [--signalling-url URL]] [--api-key KEY]

Over WebSocket (the default) or WebRTC (``--webrtc``, Opus audio; the optional aiortc extra). Events
are printed one line each, with audio payloads reduced to their size and transcripts whole, and after
each response a line with its latency. The exit status is 1 when the server sent an error event or a
response failed, or no response came. The helpers here (WAV I/O, event
summaries, following the turns) are shared with ``gateway.clients.replay``; the transports are
gateway.clients.connection's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gateway.audio import SAMPLE_RATE, StreamResampler, wav_bytes, wav_to_pcm16
from gateway.clients import connection
from gateway.clients.connect import check_transport, open_connection
from gateway.clients.connection import (
    AUDIO_DELTA,
    CliError,
    Connection,
    ConnectionLost,
    ReplyAudio,
    endpoint_from,
)

DEFAULT_URL = "ws://127.0.0.1:8000/v1/realtime"
CHUNK_MS = 20
TAIL_MS = 1000  # silence after the speech: longer than the default silence_duration_ms (500)
RESPONSE_TIMEOUT_S = 60.0
# With server playout, how long after a response.done its playout may still start (output_audio_buffer
# .started comes with the server's next frame, 20 ms later on the gateway).
PLAYOUT_START_GRACE_S = 0.5

TRANSCRIPT_DELTA = frozenset({"response.output_audio_transcript.delta", "response.audio_transcript.delta"})

# --- WAV files ----------------------------------------------------------------------------------


def read_wav(path: str | Path) -> np.ndarray:
    """A WAV file of any common encoding, rate and channel count → int16 mono at 24 kHz."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{path}: is a directory, not a WAV file") from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return np.frombuffer(wav_to_pcm16(data), dtype=np.int16)
    except ValueError as exc:
        raise CliError(f"{path}: {exc}") from None


def check_writable(path: str | Path) -> None:
    """Fail before any work when an output file cannot be written (and leave no file behind)."""
    path = Path(path)
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not existed:
        path.unlink()


def write_wav(path: str | Path, pcm: bytes) -> None:
    """pcm16 mono 24 kHz bytes → WAV file (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(wav_bytes(pcm))


# --- Events -------------------------------------------------------------------------------------


def b64_size(data: str) -> int:
    """Decoded size of a base64 string, without decoding it."""
    return len(data) * 3 // 4 - data[-2:].count("=")


def strip_audio(event: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``event`` fit for logs: base64 audio replaced by ``<field>_bytes``: its decoded size."""
    kind = event.get("type", "")
    field = "delta" if kind in AUDIO_DELTA else "audio" if kind == "input_audio_buffer.append" else None
    if field is None or not isinstance(event.get(field), str):
        return event
    out = {k: v for k, v in event.items() if k != field}
    out[f"{field}_bytes"] = b64_size(event[field])
    return out


def describe(event: dict[str, Any]) -> str:
    """One compact line for an event: its type and the fields worth seeing."""
    kind = str(event.get("type", "?"))
    parts = [kind]
    if kind == "error":
        err = event.get("error") or {}
        parts.append(f"{err.get('code') or err.get('type')}: {err.get('message')}")
        return " ".join(parts)
    if kind in AUDIO_DELTA:
        parts.append(f"{b64_size(event.get('delta') or '')} B")
    elif kind in TRANSCRIPT_DELTA:
        parts.append(repr(event.get("delta", "")))
    for key in ("transcript", "text"):
        if isinstance(event.get(key), str):
            parts.append(repr(event[key]))  # whole: what was heard and said is what a person reads here
    for key in ("item_id", "response_id", "audio_start_ms", "audio_end_ms"):
        if key in event:
            parts.append(f"{key}={event[key]}")
    response = event.get("response")
    if isinstance(response, dict):
        parts.append(f"response_id={response.get('id')} status={response.get('status')}")
        reason = (response.get("status_details") or {}).get("reason")
        if reason:
            parts.append(f"reason={reason}")
    item = event.get("item")
    if isinstance(item, dict):
        parts.append(f"item={item.get('id')} {item.get('role') or item.get('type')}")
    return " ".join(parts)


class TurnTracker:
    """Follows speech and response state from server events, to know when the exchange is over.

    The conversation is quiet when no speech is in progress, no response is active, and a response
    has finished since the last speech ended (so the last turn has had its answer). With server
    playout (WebRTC) the reply is over only once the server has played it: not while its playout runs
    (output_audio_buffer.started until .stopped or .cleared), nor for a moment after a response.done
    whose playout has not started yet.
    """

    def __init__(self, server_playout: bool = False) -> None:
        self.server_playout = server_playout
        self.seq = 0
        self.speech_active = False
        self.speech_seen = False
        self.response_active = False
        self.last_stop_seq = 0
        self.last_done_seq = -1
        self.playing: set[str] = set()  # responses the server is playing out
        self._unplayed: dict[str, float] = {}  # finished responses whose playout may still start → until when
        self.closed = False  # the connection is gone: nothing more will happen
        self.changed = asyncio.Event()

    def update(self, event: dict[str, Any]) -> None:
        self.seq += 1
        kind = event.get("type")
        response_id = str(event.get("response_id"))
        if kind == "input_audio_buffer.speech_started":
            self.speech_active = self.speech_seen = True
        elif kind == "input_audio_buffer.speech_stopped":
            self.speech_active = False
            self.last_stop_seq = self.seq
        elif kind == "input_audio_buffer.committed":
            self.last_stop_seq = self.seq  # a manual commit ends a turn too
        elif kind == "response.created":
            self.response_active = True
        elif kind == "response.done":
            self.response_active = False
            self.last_done_seq = self.seq
            done_id = str((event.get("response") or {}).get("id"))
            if self.server_playout and done_id not in self.playing:
                self._unplayed[done_id] = time.monotonic() + PLAYOUT_START_GRACE_S
        elif kind == "output_audio_buffer.started":
            self.playing.add(response_id)
            self._unplayed.pop(response_id, None)
        elif kind == "output_audio_buffer.stopped":
            self.playing.discard(response_id)
        elif kind == "output_audio_buffer.cleared":
            self.playing.clear()
        self.changed.set()

    def _playout_may_start(self) -> float:
        """Seconds during which a finished response's playout may still start (0: none may)."""
        now = time.monotonic()
        self._unplayed = {r: until for r, until in self._unplayed.items() if until > now}
        return max(self._unplayed.values(), default=now) - now

    @property
    def quiet(self) -> bool:
        return (
            not self.speech_active
            and not self.response_active
            and self.last_done_seq > self.last_stop_seq
            and not self.playing
            and not self._playout_may_start()
        )

    def close(self) -> None:
        self.closed = True
        self.changed.set()

    async def wait_quiet(self, timeout: float) -> bool:
        """True once quiet; False on timeout or when the connection closed first."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.quiet and not self.closed:
            self.changed.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self.changed.wait(), min(remaining, self._playout_may_start() or remaining))
            except TimeoutError:
                continue  # the deadline, or a playout that did not start: the loop decides
        return self.quiet


# --- The client ---------------------------------------------------------------------------------


class Printer:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, arrow: str, text: str) -> None:
        print(f"{time.monotonic() - self.t0:8.3f}s {arrow} {text}", flush=True)


class Latency:
    """Each response's latency as the client saw it, one line when it is done: from the end of the user's
    speech (when the append that carried speech_stopped's audio_end_ms went out) and from speech_stopped's
    arrival, to the reply's first audio. Also counts what makes the run a failure (error events, failed
    responses)."""

    def __init__(self, conn: Connection, show: Printer) -> None:
        self.conn, self.show = conn, show
        self.turns = 0
        self.problems: list[str] = []
        self._stopped: tuple[float | None, float] | None = None  # (speech end sent, speech_stopped received)
        self._starts: dict[str, tuple[float | None, float] | None] = {}  # response id → its turn's marks
        self._first_audio: dict[str, float] = {}

    def event(self, event: dict[str, Any]) -> None:
        kind, now = event.get("type"), time.monotonic()
        if kind == "input_audio_buffer.speech_stopped":
            self._stopped = (self.conn.sent_at(float(event.get("audio_end_ms") or 0)), now)
        elif kind == "response.created":
            self._starts[str((event.get("response") or {}).get("id"))] = self._stopped
            self._stopped = None
        elif kind == "output_audio_buffer.started":  # WebRTC: the server starts playing it
            self._first_audio.setdefault(str(event.get("response_id")), now)
        elif kind == "error":
            error = event.get("error") or {}
            self.problems.append(f"error event: {error.get('code') or error.get('type')}: {error.get('message')}")
        elif kind == "response.done":
            self._done(event.get("response") or {}, now)

    def audio(self, audio: ReplyAudio) -> None:
        if audio.pcm:
            self._first_audio.setdefault(str(audio.response_id), time.monotonic())

    def _done(self, response: dict[str, Any], now: float) -> None:
        rid = str(response.get("id"))
        status = str(response.get("status"))
        if status == "failed":
            error = (response.get("status_details") or {}).get("error") or {}
            self.problems.append(f"response {rid} failed: {error.get('message') or error.get('code')}")
        start, first = self._starts.pop(rid, None), self._first_audio.pop(rid, None)
        self.turns += 1
        parts = [f"turn {self.turns} ({status})"]
        if first is not None and start is not None:
            spoken_end, stopped = start
            if spoken_end is not None:
                parts.append(f"first audio {(first - spoken_end) * 1000:.0f} ms after your speech ended")
            parts.append(f"{(first - stopped) * 1000:.0f} ms after speech_stopped")
        elif first is None:
            parts.append("no audio")
        if start is not None:
            parts.append(f"done {(now - start[1]) * 1000:.0f} ms after speech_stopped")
        self.show("*", ", ".join(parts))


async def _receive(conn: Connection, tracker: TurnTracker, latency: Latency, reply: bytearray, show: Printer) -> None:
    try:
        async for item in conn:
            if isinstance(item, ReplyAudio):
                reply.extend(item.pcm)
                latency.audio(item)
                continue
            show("<", describe(item))
            tracker.update(item)
            latency.event(item)
    finally:
        tracker.close()


async def _stream_wav(conn: Connection, samples: np.ndarray) -> None:
    """Send the samples, then TAIL_MS of silence, in CHUNK_MS pieces at real time."""
    pcm = samples.tobytes() + bytes(SAMPLE_RATE * TAIL_MS // 1000 * 2)
    step = SAMPLE_RATE * CHUNK_MS // 1000 * 2
    for offset in range(0, len(pcm), step):
        await conn.send_audio(pcm[offset : offset + step])


def _sounddevice() -> Any:
    """The optional sounddevice module (PortAudio), or CliError saying why there is no microphone."""
    try:
        import sounddevice  # type: ignore[import-not-found]  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise CliError("no --wav given, and microphone input needs the sounddevice package") from None
    except OSError as exc:  # the package is there but the PortAudio library is not
        raise CliError(f"microphone unavailable: {exc}") from None
    return sounddevice


async def _stream_microphone(conn: Connection, sounddevice: Any, show: Printer) -> None:
    """Send the default microphone's audio until Ctrl-C."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[np.ndarray] = asyncio.Queue()
    try:
        rate = int(sounddevice.query_devices(kind="input")["default_samplerate"])
    except (sounddevice.PortAudioError, ValueError) as exc:
        raise CliError(f"microphone unavailable: {exc}") from None
    resampler = StreamResampler(rate, SAMPLE_RATE)

    def on_audio(indata: np.ndarray, frames: int, when: Any, status: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, indata[:, 0].copy())

    blocksize = rate * CHUNK_MS // 1000
    with sounddevice.InputStream(samplerate=rate, channels=1, dtype="int16", blocksize=blocksize, callback=on_audio):
        show("*", f"microphone open at {rate} Hz; Ctrl-C to stop")
        while True:
            chunk = resampler.process(await queue.get())
            if len(chunk):
                await conn.send_audio(chunk.tobytes())


async def session(args: argparse.Namespace) -> int:
    """Talk to the endpoint once (see the module docstring); returns the exit code."""
    endpoint = endpoint_from(args, "webrtc" if args.webrtc else "websocket")
    check_transport(endpoint.transport)  # fail before any work
    samples = read_wav(args.wav) if args.wav else None
    sounddevice = _sounddevice() if samples is None else None
    check_writable(args.out)
    show = Printer()
    reply = bytearray()
    conn = await open_connection(endpoint)
    tracker = TurnTracker(conn.server_playout)
    latency = Latency(conn, show)
    show("*", f"connected to {endpoint.address} over {conn.transport} ({'beta' if args.beta else 'GA'} protocol)")
    receiver = asyncio.create_task(_receive(conn, tracker, latency, reply, show))
    code = 0
    try:
        if samples is None:
            await _stream_microphone(conn, sounddevice, show)
        else:
            show("*", f"streaming {args.wav} ({len(samples) / SAMPLE_RATE:.2f} s) at real time")
            await _stream_wav(conn, samples)
            if not tracker.speech_seen:
                # Turn detection is off, or found no speech: end the turn ourselves.
                show("*", "no speech detected by the server; committing the buffer manually")
                await conn.send({"type": "input_audio_buffer.commit"})
                await conn.send({"type": "response.create"})
            if not await tracker.wait_quiet(RESPONSE_TIMEOUT_S):
                problem = "the connection closed" if tracker.closed else f"{RESPONSE_TIMEOUT_S:.0f} s passed"
                show("*", f"{problem} before the response was done")
                code = 1
    except ConnectionLost as exc:
        show("*", f"connection closed by the server: {exc}")
        code = 1
    except asyncio.CancelledError:  # Ctrl-C: the way to end a microphone session
        if samples is not None:
            raise
        show("*", "stopped")
    finally:
        receiver.cancel()
        await conn.close()
    write_wav(args.out, bytes(reply))
    show("*", f"wrote {args.out} ({len(reply) / 2 / SAMPLE_RATE:.2f} s of reply audio)")
    for problem in latency.problems:
        show("*", problem)
    return 1 if latency.problems else code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Stream a WAV file (or the microphone) to a Realtime endpoint at real time, over WebSocket or WebRTC, "
        "print its events one line each, and write the reply audio to a WAV file."
    )
    parser.add_argument("--wav", help="WAV file to send (PCM or float, any rate and channels); without it, the "
                        "microphone")
    parser.add_argument("--out", default="reply.wav", help="where to write the reply audio (default reply.wav)")
    parser.add_argument("--webrtc", action="store_true",
                        help="connect over WebRTC (Opus audio, events on the oai-events data channel; needs the "
                        "webrtc extra) instead of WebSocket")
    connection.add_arguments(parser, DEFAULT_URL)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(session(args))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway client")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
