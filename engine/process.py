"""The engine process: one process owns one device and batches the streams of every gateway process
connected to it, over ZeroMQ (the protocol is in engine.ipc).

    python -m engine.process --endpoint ipc:///tmp/vg/engine-0.sock --config '{"checkpoint": "...", ...}'

One thread does everything. Between steps it takes in what the clients sent, so a cancel takes effect
before the next step; then it runs one pass of the batching loop (engine.batcher.Batcher), whose deliveries
go straight out on the socket. Started with an end-of-turn model ([engine] turn_model), it also answers
whether turns are finished: the TURNs taken in together run as one batch before the next step. Started with
the VAD model ([engine] vad_model), a second thread serves the gateways' VAD steps on a socket and a CUDA
stream of its own (VadServer), so they never wait for a TTS step.

It binds only once the model is loaded and its CUDA graphs are captured, then prints one JSON line on
stdout, {"ready": endpoint}, or {"error": message} when it cannot start: engine.supervisor waits for that
line. It exits on SIGTERM (failing its open streams with a clear error first) and when the process that
started it is gone (--parent); it ignores SIGINT, which a terminal's Ctrl-C sends to the whole process
group: its supervisor stops it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from functools import partial
from typing import Any

import numpy as np
import zmq

from engine import ipc
from engine.api import TTSChunk, TTSError
from engine.batcher import Batcher, Utterance
from engine.config import EngineConfig
from engine.turn_model import N_SAMPLES, TurnModel
from engine.vad_model import HIDDEN, SAMPLES, VadModel
from engine.voices import VoiceError, VoicePrompt

log = logging.getLogger("engine.process")

DRAIN_LIMIT = 10_000  # messages taken in per pass, so a flood of them cannot stall the steps
REMEMBERED_DROPS = 1024  # clients dropped lately, told so (RESET) if they speak again
# Turns in one end-of-turn model call: bounds its memory and how long it holds the steps (and the heartbeats'
# answers): a few ms for 64 on a GPU, ~100 ms a turn on a CPU core.
MAX_TURN_BATCH = {"cuda": 64, "cpu": 2}
MAX_VAD_ROWS = 4096  # windows in one VAD request: 8 of every stream of a 512-session worker
# A VAD pass starts at most this long after the last one: the requests that come meanwhile share it. Each pass
# launches the same ~25 kernels whatever its batch, so under load (every worker asking every 10 ms) fewer,
# bigger passes cost less CPU; an idle engine answers at once.
VAD_PASS_S = 0.002
# The interpreter's switch interval where the VAD thread serves: it gets the GIL within 1 ms of asking, not
# after the TTS thread's next 5 ms of Python.
VAD_SWITCH_INTERVAL_S = 0.001


class Client:
    """One connected gateway process (a DEALER socket) and the streams it opened here."""

    def __init__(self, identity: bytes, now: float) -> None:
        self.identity = identity
        self.heard = now
        self.streams: dict[bytes, Utterance] = {}
        self.gone = False


class EngineServer:
    def __init__(self, batcher: Batcher, socket: zmq.Socket, heartbeat_s: float, parent: int | None = None,
                 turn_model: TurnModel | None = None, vad: VadServer | None = None) -> None:
        self.batcher = batcher
        self.turn_model = turn_model
        self.vad = vad
        self._turns: list[tuple[Client, bytes, np.ndarray]] = []  # taken in, not yet given to the batcher
        self._judging = False  # a batch of them is with the batcher
        self.turns_judged = 0
        self.turn_seconds = 0.0
        self.socket = socket
        self.heartbeat_s = heartbeat_s
        self.parent = parent
        self.instance = os.urandom(8).hex()
        self.started = time.monotonic()
        self.clients: dict[bytes, Client] = {}
        self.dropped: dict[bytes, str] = {}  # identity -> why, oldest first
        self.stopping = False
        self._next_check = 0.0

    def serve(self) -> None:
        while not self.stopping:
            idle = not self.batcher.has_work() and not self._turns
            if self.socket.poll(int(self.heartbeat_s * 1000) if idle else 0, zmq.POLLIN):
                self._drain()
            self._submit_turns()
            self._check_liveness()
            if self.batcher.has_work():
                self.batcher.run_pass()
        self.batcher.fail_all(ipc.EngineGone("the engine process is shutting down"))

    # -- what clients send --
    def _drain(self) -> None:
        for _ in range(DRAIN_LIMIT):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, kind, args = frames[0], frames[1] if len(frames) > 1 else b"", frames[2:]
            client = self.clients.get(identity)
            if client is None:
                client = self.clients[identity] = Client(identity, time.monotonic())
                why = self.dropped.pop(identity, None)
                if why is not None and kind != ipc.BYE:
                    self._send(client, [ipc.RESET, why.encode()])
            client.heard = time.monotonic()
            try:
                self._handle(client, kind, args)
            except (IndexError, ValueError) as exc:  # a malformed message: the protocol's peers never send one
                log.warning("bad %r message from a client: %s", kind[:16], exc)

    def _handle(self, client: Client, kind: bytes, args: list[bytes]) -> None:
        if kind == ipc.PING:
            self._send(client, [ipc.PONG, self.instance.encode(), str(self.batcher.load).encode()])
        elif kind == ipc.HELLO:
            self._send(client, [ipc.HELLO, json.dumps(self.hello()).encode()])
        elif kind == ipc.OPEN:
            sid = args[0]
            try:
                spec, text, end = ipc.read_open(args)
                voice_prompt = VoicePrompt.from_bytes(spec.prompt) if spec.prompt else None
                target = self.batcher.resolve(spec.voice, spec.language, voice_prompt, spec.instructions)
                utterance = Utterance(self.batcher, target, partial(self._deliver, client, sid), spec.sampling)
                client.streams[sid] = self.batcher.admit(utterance)
            except (TTSError, VoiceError) as exc:
                self._send(client, [ipc.ERROR, sid, ipc.INPUT, str(exc).encode()])
                return
            self._text(utterance, text or None, end=end)  # the text fed, and the end given, before it left
        elif kind == ipc.PREPARE:
            token, rate, text = args[0], int(args[2]), args[3].decode()
            audio = np.frombuffer(args[1], dtype="<f4")
            self.batcher.submit(lambda: self.batcher.prepare_voice(audio, rate, text or None),
                                partial(self._prepared, client, token))
        elif kind == ipc.TURN:
            token, audio = args[0], np.frombuffer(args[1], dtype="<f4")
            if self.turn_model is None:
                self._send(client, [ipc.TURN, token, ipc.INPUT, b"this engine process has no end-of-turn model"])
            elif not 0 < len(audio) <= N_SAMPLES:
                self._send(client, [ipc.TURN, token, ipc.INPUT, f"a turn is 1 to {N_SAMPLES} samples".encode()])
            else:
                self._turns.append((client, token, audio))
        elif kind in (ipc.FEED, ipc.END):
            utterance = client.streams.get(args[0])
            if utterance is None:
                return  # a stream that already ended or was cancelled
            self._text(utterance, args[1].decode() if kind == ipc.FEED else None, end=kind == ipc.END)
        elif kind == ipc.CANCEL:
            utterance = client.streams.pop(args[0], None)
            if utterance is not None:
                utterance.cancel()
        elif kind == ipc.STATS:
            stats = {**self.batcher.counters(), "turns": self.turns_judged, "turn_seconds": self.turn_seconds,
                     "vad_windows": self.vad.windows if self.vad else 0,
                     "vad_seconds": self.vad.seconds if self.vad else 0.0,
                     "cpu_seconds": time.process_time(), "instance": self.instance,
                     "pid": os.getpid(), "clients": len(self.clients),
                     "uptime_s": round(time.monotonic() - self.started, 3)}
            self._send(client, [ipc.STATS, args[0], json.dumps(stats).encode()])
        elif kind == ipc.BYE:
            self._drop(client, "said goodbye")
        else:
            raise ValueError("unknown kind")

    def _submit_turns(self) -> None:
        """The next batch of the turns taken in, as a job for the batching loop's thread (the one that owns the
        device): one batch at a time, so the clients' messages are taken in between two."""
        model, most = self.turn_model, MAX_TURN_BATCH.get(self.batcher.device.type, 2)
        if not self._turns or model is None or self._judging:
            return
        batch, self._turns = self._turns[:most], self._turns[most:]
        audio = np.stack([np.pad(a, (N_SAMPLES - len(a), 0)) for _, _, a in batch])
        self._judging = True
        self.batcher.submit(partial(self._judge, model, audio), partial(self._turned, batch))

    def _judge(self, model: TurnModel, audio: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        try:
            return model.predict(audio)  # its numpy result waits for the device
        finally:
            self.turn_seconds += time.perf_counter() - started

    def _turned(self, batch: list[tuple[Client, bytes, np.ndarray]], result: np.ndarray | BaseException) -> None:
        self._judging = False
        if isinstance(result, BaseException):
            log.error("the end-of-turn model failed: %r", result)
            answers = [[ipc.ENGINE, str(result).encode()]] * len(batch)
        else:
            answers = [[ipc.OK, f"{p:.6f}".encode()] for p in result.tolist()]
            self.turns_judged += len(batch)
        for (client, token, _), answer in zip(batch, answers, strict=True):
            self._send(client, [ipc.TURN, token, *answer])

    @staticmethod
    def _text(utterance: Utterance, text: str | None, *, end: bool) -> None:
        """Feed `text` (None: none), then end the utterance when `end`; bad input fails it with the TTSError."""
        try:
            if text is not None:
                utterance.feed(text)
            if end:
                utterance.end()
        except TTSError as exc:
            utterance.cancel()
            utterance.deliver(exc)

    def hello(self) -> dict[str, Any]:
        b = self.batcher
        return {"instance": self.instance, "pid": os.getpid(), "device": str(b.device),
                "rows": b.max_streams * len(b.models), "voices": sorted(b.voices), "languages": sorted(b.languages),
                "kinds": b.kinds, "fingerprints": b.fingerprints, "follows_instructions": b.follows_instructions,
                "max_text_chars": b.max_text_chars, "turns": self.turn_model is not None, "vad": self.vad is not None,
                "heartbeat_s": self.heartbeat_s}

    # -- what goes back --
    def _deliver(self, client: Client, sid: bytes, item: TTSChunk | BaseException | None) -> None:
        """An utterance's packet, end or failure, from the batching loop."""
        if item is None:
            frames = [ipc.DONE, sid]
        elif isinstance(item, BaseException):
            cause = ipc.INPUT if isinstance(item, TTSError) else ipc.ENGINE
            text = str(item) if isinstance(item, TTSError | ipc.EngineGone) else f"{type(item).__name__}: {item}"
            frames = [ipc.ERROR, sid, cause, text.encode()]
        else:
            frames = [ipc.PACKET, sid, item.text.encode(), item.pcm]
        if not isinstance(item, TTSChunk):
            client.streams.pop(sid, None)
        self._send(client, frames)

    def _prepared(self, client: Client, token: bytes, result: VoicePrompt | BaseException) -> None:
        """A prepared voice, or why it could not be, from the batching loop."""
        if isinstance(result, VoicePrompt):
            self._send(client, [ipc.VOICE, token, ipc.OK, result.to_bytes()])
        else:
            cause = ipc.INPUT if isinstance(result, TTSError) else ipc.ENGINE
            if cause == ipc.ENGINE:
                log.error("preparing a voice failed: %r", result)
            self._send(client, [ipc.VOICE, token, cause, str(result).encode()])

    def _send(self, client: Client, frames: list[bytes]) -> None:
        if client.gone:
            return
        try:
            self.socket.send_multipart([client.identity, *frames], zmq.NOBLOCK)
        except zmq.Again:
            self._drop(client, f"does not keep up (over {ipc.QUEUE_LIMIT} messages queued)")
        except zmq.ZMQError as exc:  # EHOSTUNREACH (ROUTER_MANDATORY): its connection is closed
            self._drop(client, f"is unreachable ({exc})")

    # -- liveness --
    def _check_liveness(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.heartbeat_s
        silent = now - ipc.MISSED_HEARTBEATS * self.heartbeat_s
        for client in [c for c in self.clients.values() if c.heard < silent]:
            self._drop(client, f"was silent for {now - client.heard:.1f} s")
        if self.parent is not None and os.getppid() != self.parent:
            log.warning("the process that started this engine is gone; exiting")
            self.stopping = True

    def _drop(self, client: Client, why: str) -> None:
        """Forget a client and free its streams (their rows go at the next pass)."""
        if client.streams:
            log.info("a client %s: freeing its %d streams", why, len(client.streams))
        client.gone = True
        self.clients.pop(client.identity, None)
        self.dropped[client.identity] = f"the client {why}"
        while len(self.dropped) > REMEMBERED_DROPS:
            del self.dropped[next(iter(self.dropped))]
        for utterance in client.streams.values():
            utterance.cancel()
        client.streams.clear()


class VadServer:
    """The VAD's socket (engine.ipc.vad_endpoint) and its thread: each turn takes every request that has
    come, runs their windows as one batch and answers each (engine.ipc's VAD messages)."""

    def __init__(self, model: VadModel, socket: zmq.Socket) -> None:
        self.model = model
        self.socket = socket
        self.windows = 0
        self.seconds = 0.0
        self.stopping = False
        self._thread = threading.Thread(target=self._serve, name="vad", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping = True
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        last = 0.0
        while not self.stopping:
            if not self.socket.poll(100, zmq.POLLIN):
                continue
            if (wait := last + VAD_PASS_S - time.monotonic()) > 0:
                time.sleep(wait)
            last = time.monotonic()
            steps: list[tuple[bytes, bytes, np.ndarray, np.ndarray]] = []
            for _ in range(DRAIN_LIMIT):
                try:
                    frames = self.socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if (step := self._read(frames)) is not None:
                    steps.append(step)
            if steps:
                self._run(steps)

    def _read(self, frames: list[bytes]) -> tuple[bytes, bytes, np.ndarray, np.ndarray] | None:
        """A request's identity, token, x and state; None for a malformed one (answered when it can be)."""
        if len(frames) != 4:
            log.warning("a VAD request of %d frames, not 4", len(frames))
            return None
        identity, token, x, state = frames
        rows = len(x) // (SAMPLES * 4)
        if not 0 < rows <= MAX_VAD_ROWS or len(x) != rows * SAMPLES * 4 or len(state) != rows * 2 * HIDDEN * 4:
            self._answer(identity, [token, ipc.INPUT, f"a VAD step is 1 to {MAX_VAD_ROWS} windows of {SAMPLES} "
                                                      f"samples and their state".encode()])
            return None
        return (identity, token, np.frombuffer(x, dtype="<f4").reshape(rows, SAMPLES),
                np.frombuffer(state, dtype="<f4").reshape(2, rows, HIDDEN))

    def _run(self, steps: list[tuple[bytes, bytes, np.ndarray, np.ndarray]]) -> None:
        started = time.perf_counter()
        try:
            probs, state = self.model.infer(np.concatenate([x for _, _, x, _ in steps]),
                                            np.concatenate([s for _, _, _, s in steps], axis=1))
        except Exception as exc:  # answered, so each gateway falls back to its own VAD at once
            log.error("the VAD model failed: %r", exc)
            for identity, token, _, _ in steps:
                self._answer(identity, [token, ipc.ENGINE, str(exc).encode()])
            return
        finally:
            self.seconds += time.perf_counter() - started
        offset = 0
        for identity, token, x, _ in steps:
            rows = slice(offset, offset + len(x))
            offset += len(x)
            self._answer(identity, [token, ipc.OK, probs[rows].astype("<f4").tobytes(),
                                    state[:, rows].astype("<f4").tobytes()])
        self.windows += offset

    def _answer(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            self.socket.send_multipart([identity, *frames], zmq.NOBLOCK)
        except zmq.ZMQError:  # a gateway that is gone or does not keep up asks again or uses its own VAD
            pass


def bind(endpoint: str) -> zmq.Socket:
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
    socket.setsockopt(zmq.SNDHWM, ipc.QUEUE_LIMIT)
    socket.setsockopt(zmq.RCVHWM, ipc.QUEUE_LIMIT)
    socket.setsockopt(zmq.LINGER, 1000)  # the last errors still go out at shutdown
    socket.bind(endpoint)
    return socket


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.process", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True, help="ZeroMQ endpoint to bind, e.g. ipc:///tmp/vg/e0.sock")
    parser.add_argument("--config", required=True, help="the [engine] options as a JSON object")
    parser.add_argument("--heartbeat-ms", type=float, default=500)
    parser.add_argument("--parent", type=int, help="exit when this process is no longer the parent")
    args = parser.parse_args(argv)
    config = EngineConfig.from_dict(json.loads(args.config))
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s engine[{config.device}] %(name)s: %(message)s")
    # SIGTERM stops the loop between passes (the handler only sets a flag).
    server: EngineServer | None = None

    def stop(*_: Any) -> None:
        if server is not None:
            server.stopping = True
        else:
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    # Ctrl-C reaches the whole process group: the supervisor's process handles it and stops this one in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        batcher = Batcher.from_config(config)
        turn_model = TurnModel.from_onnx(config.turn_model, batcher.device) if config.turn_model else None
        vad = VadServer(VadModel.from_file(config.vad_model, batcher.device),
                        bind(ipc.vad_endpoint(args.endpoint))) if config.vad_model else None
        socket = bind(args.endpoint)
    except Exception as exc:  # any start-up failure is reported to the supervisor, which does not retry it
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 2
    server = EngineServer(batcher, socket, args.heartbeat_ms / 1000, args.parent, turn_model, vad)
    models = [name for name, model in (("the end-of-turn model", turn_model), ("the VAD", vad)) if model]
    log.info("serving %s (%s, %d rows each, on %s%s)", args.endpoint, ", ".join(batcher.kinds), batcher.max_streams,
             batcher.device, "".join(f", with {m}" for m in models))
    if vad is not None:
        sys.setswitchinterval(VAD_SWITCH_INTERVAL_S)
        vad.start()
    print(json.dumps({"ready": args.endpoint}), flush=True)
    server.serve()
    if vad is not None:
        vad.stop()
        vad.socket.close()
    socket.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
