"""Silero voice activity detection on the session's input audio: the model and its per-session state.

- ``SileroModel``: the ONNX model, loaded once per process and shared by all sessions.
- ``EngineVad``: the same model's steps on an engine process's device ([vad] device), with the first to
  fall back on.
- ``SileroVAD``: one per session; turns pcm16 24 kHz input into one speech probability per 32 ms
  window (512 samples at 16 kHz), exactly like the reference ``OnnxWrapper`` in
  ``silero_vad/utils_vad.py``. ``process_many`` resamples several sessions' windows in one pass and runs
  them in one batched call, and ``VadBatcher`` does so for every session of an event loop, in the VAD's
  thread.

The turn detection over the probabilities is the sans-I/O core's (gateway/core/vad.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import onnxruntime
import zmq
from numpy.lib.stride_tricks import as_strided

from engine import ipc
from gateway.audio import SAMPLE_RATE, Float32Array, polyphase_filter
from gateway.core.responder import BackendError
from gateway.shipped import silero_file

log = logging.getLogger(__name__)
MODEL_FILE = "silero_vad.onnx"
MODEL_SHA256 = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"
"""SHA-256 of silero_vad.onnx in silero-vad==6.2.3; releases changed the file at the same size."""

VAD_RATE = 16_000
WINDOW = 512  # samples at 16 kHz per model call
WINDOW_INPUT = WINDOW * SAMPLE_RATE // VAD_RATE  # samples of 24 kHz input per window
WINDOW_BYTES = 2 * WINDOW_INPUT
CONTEXT = 64  # samples of the previous window prepended to each call (the model needs them)
# The 24 → 16 kHz filter (gateway.audio.polyphase_filter), reversed so that a window's row times it is the
# output. 16 taps a phase: its delay is 0.32 ms, and an output needs no input after its own position, so a
# window is whole as soon as its 32 ms of input are.
TAPS = 16
PAIR = np.zeros((TAPS + 1, 2), dtype=np.float32)  # [input 3m .. 3m + TAPS] @ PAIR = outputs 2m, 2m + 1
PAIR[:TAPS, 0], PAIR[1:, 1] = (phase[::-1] / 32768 for phase in polyphase_filter(2, 3, TAPS))
# What a stream carries from one window to the next, in one row (SileroVAD._carry): the filter's input history
# (pcm16 values: the output is scaled, not the input), the model's 64 samples of context, its recurrent state.
# One row, so that a batch gathers and scatters every stream's in one numpy call each.
HISTORY = slice(0, TAPS - 1)
CONTEXT_AT = slice(TAPS - 1, TAPS - 1 + CONTEXT)
STATE_AT = slice(TAPS - 1 + CONTEXT, TAPS - 1 + CONTEXT + 2 * 128)
CARRY = STATE_AT.stop


class StepModel(Protocol):
    """What steps a batch of streams: SileroModel, or EngineVad."""

    def infer(self, x: Float32Array, state: Float32Array) -> tuple[Float32Array, Float32Array]:
        """One step for B streams: x [B, 576] (context + window), state [2, B, 128] → (probs [B], state)."""
        ...


class ModelChecksumError(RuntimeError):
    """The VAD model file is not the one this code was validated with."""


class SileroModel:
    """The Silero VAD ONNX model: one InferenceSession for the whole process.

    onnxruntime's ``run()`` is thread-safe, so sessions (and worker threads) share this object.
    One intra-op and one inter-op thread: the gateway gets parallelism from many sessions, and
    extra ORT threads would only contend for the same two cores.
    """

    _shared: SileroModel | None = None
    _shared_lock = threading.Lock()

    def __init__(self, path: str | Path | None = None, sha256: str | None = MODEL_SHA256) -> None:
        if path is None:
            path = silero_file(MODEL_FILE)
        self.path = Path(path)
        data = self.path.read_bytes()
        if sha256 is not None:
            actual = hashlib.sha256(data).hexdigest()
            if actual != sha256.lower():
                raise ModelChecksumError(
                    f"VAD model {self.path} has SHA-256 {actual}, expected {sha256.lower()}; "
                    "install silero-vad==6.2.3 or update MODEL_SHA256 after validating the new model"
                )
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            data, sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._sr = np.array(VAD_RATE, dtype=np.int64)

    @classmethod
    def shared(cls) -> SileroModel:
        """The process-wide instance, loaded on first use (~50 ms)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def infer(self, x: Float32Array, state: Float32Array) -> tuple[Float32Array, Float32Array]:
        """One step for B streams: x [B, 576] (context + window), state [2, B, 128] → (probs [B], state)."""
        out, new_state = self._session.run(None, {"input": x, "state": state, "sr": self._sr})
        return out[:, 0], new_state


class SileroVAD:
    """Speech probabilities for one session's input stream; not thread-safe (one caller at a time).

    Input is cut into windows of 32 ms (768 samples at 24 kHz) as it arrives, and each window is resampled to
    16 kHz with the input before it (``_windows``): window ``i`` covers input time [32·i, 32·i + 32) ms, less
    the filter's 0.32 ms delay, and is ready as soon as its input is. The partial window, the filter's history,
    the 64-sample context and the model's recurrent state carry across calls, so any chunking of the same
    audio gives the same probabilities.
    """

    def __init__(self, model: StepModel | None = None) -> None:
        self.model: StepModel = model if model is not None else SileroModel.shared()
        self.queued = 0
        """Windows fed to a VadBatcher whose probabilities have not been delivered yet."""
        self.reset()

    def reset(self) -> None:
        """Start over as for a new stream (window count back to 0)."""
        self._raw = bytearray()  # input short of a whole window
        self._pending = np.zeros(0, dtype=np.float32)  # process_16k's partial window
        self._carry = np.zeros(CARRY, dtype=np.float32)
        self._forget = False
        self.windows = 0
        """Windows processed since the last reset; window i starts at input time 32·i ms."""

    def forget(self) -> None:
        """From the next batch on, the model's context and recurrent state as a new stream's; the input's timing
        (windows, the resampler's history) goes on. A flag, not a write: a batch in the VAD's thread writes this
        stream's state back when it ends."""
        self._forget = True

    def process(self, pcm24k: bytes) -> Float32Array:
        """Feed pcm16 24 kHz bytes; return the probabilities of the windows this completes (maybe none)."""
        return _infer([self], [self.take(pcm24k)])[0]

    def process_16k(self, samples: Float32Array) -> Float32Array:
        """Feed float32 audio already at 16 kHz (bypasses the resampler; the reference's entry point)."""
        buf = np.concatenate((self._pending, np.asarray(samples, dtype=np.float32)))
        n = len(buf) // WINDOW
        self._pending = buf[n * WINDOW :].copy()
        return _step([self], buf[: n * WINDOW].reshape(n, WINDOW), np.array([n]), self._carry[None])[0]

    def windows_pending(self, nbytes: int) -> int:
        """How many windows an append of ``nbytes`` would complete."""
        return (len(self._raw) + nbytes) // WINDOW_BYTES

    def take(self, pcm24k: bytes) -> bytes:
        """Add pcm16 24 kHz input; return the input of the whole windows it completes (WINDOW_BYTES each, maybe
        none), for ``_windows``. Cheap: the event loop calls it for every append."""
        raw = self._raw
        raw += pcm24k
        whole = len(raw) - len(raw) % WINDOW_BYTES
        if not whole:
            return b""
        taken = bytes(raw[:whole])
        del raw[:whole]
        return taken


def process_many(items: Sequence[tuple[SileroVAD, bytes]]) -> list[Float32Array]:
    """``vad.process(pcm)`` for several sessions at once, batching their windows into shared model calls.

    Equivalent to calling each ``process`` in turn, bit for bit whatever else shares the batch (so a
    session's turns are the same alone or among others: tests/runtime/test_vad.py checks it on the
    machine that runs the tests), but a batch of 8+ streams costs ~48 µs of CPU per window instead of
    ~90 µs (python -m bench turns). All VADs must share one model, and each VAD may appear only once.
    """
    if not items:
        return []
    if len({id(vad) for vad, _ in items}) != len(items):
        raise ValueError("process_many: a VAD appears twice; concatenate its audio instead")
    vads = [vad for vad, _ in items]
    return _infer(vads, [vad.take(pcm) for vad, pcm in items])


def _infer(vads: list[SileroVAD], inputs: list[bytes]) -> list[Float32Array]:
    """Each VAD's taken input (``SileroVAD.take``: whole windows) resampled and through the model."""
    counts = np.array([len(pcm) // WINDOW_BYTES for pcm in inputs])
    carry = np.stack([vad._carry for vad in vads])
    for i, vad in enumerate(vads):
        if vad._forget:
            vad._forget = False
            carry[i, CONTEXT_AT] = carry[i, STATE_AT] = 0.0
    return _step(vads, _windows(b"".join(inputs), counts, carry), counts, carry)


def _step(vads: list[SileroVAD], windows: Float32Array, counts: npt.NDArray[np.int64],
          carry: Float32Array) -> list[Float32Array]:
    """Each VAD's windows at 16 kHz (``counts[i]`` rows of ``windows`` [n, 512], in VAD order) through the model,
    in order: step k runs every VAD's k-th window in one call. ``carry`` holds the VADs' rows (``_carry``),
    which become theirs with this batch's context and state. Numpy calls per batch and per step, and one pass
    over the VADs: the VAD's thread runs this for every session of its loop, every batch."""
    model = vads[0].model
    if any(vad.model is not model for vad in vads):
        raise ValueError("a batch needs VADs that share one SileroModel")
    starts = np.cumsum(counts) - counts  # each VAD's first row
    probs = np.empty(len(windows), dtype=np.float32)
    x = np.empty((len(vads), CONTEXT + WINDOW), dtype=np.float32)
    active = np.flatnonzero(counts)
    for step in range(int(counts.max(initial=0))):
        active = active[counts[active] > step]
        rows, n = starts[active] + step, len(active)
        x[:n, CONTEXT:] = windows[rows]
        # The 64 samples before each window: its VAD's last window's, or this batch's previous row's.
        x[:n, :CONTEXT] = carry[active, CONTEXT_AT] if step == 0 else windows[rows - 1, -CONTEXT:]
        state = np.ascontiguousarray(carry[active, STATE_AT].reshape(n, 2, 128).transpose(1, 0, 2))
        probs[rows], new_state = model.infer(x[:n], state)
        carry[active, STATE_AT] = new_state.transpose(1, 0, 2).reshape(n, 2 * 128)
    done = np.flatnonzero(counts)
    carry[done, CONTEXT_AT] = windows[starts[done] + counts[done] - 1, -CONTEXT:]
    results = []
    for vad, row, start, n in zip(vads, carry, starts.tolist(), counts.tolist(), strict=True):
        vad._carry = row
        vad.windows += n
        results.append(probs[start : start + n])
    return results


def _windows(pcm: bytes, counts: npt.NDArray[np.int64], carry: Float32Array) -> Float32Array:
    """Every VAD's windows (``counts[i]`` of them, their input in ``pcm``, in VAD order) at 16 kHz, [n, 512]. A
    row is a window's input after the TAPS - 1 samples before it: the previous row's tail, or its VAD's
    history (in ``carry``, which gets the new history)."""
    rows = np.empty((len(pcm) // WINDOW_BYTES, TAPS - 1 + WINDOW_INPUT), dtype=np.float32)
    rows[:, TAPS - 1 :] = np.frombuffer(pcm, dtype="<i2").reshape(-1, WINDOW_INPUT)
    rows[1:, : TAPS - 1] = rows[:-1, 1 - TAPS :]
    ids = np.flatnonzero(counts)
    firsts = (np.cumsum(counts) - counts)[ids]
    rows[firsts, : TAPS - 1] = carry[ids, HISTORY]
    carry[ids, HISTORY] = rows[firsts + counts[ids] - 1, 1 - TAPS :]
    return _resample(rows)


def _resample(rows: Float32Array) -> Float32Array:
    """Windows' input [n, TAPS - 1 + 768], pcm16 values at 24 kHz -> the windows at 16 kHz [n, 512], in [-1, 1).
    Output 2m is the filter's phase 0 at input sample 3m, output 2m + 1 its phase 1 at input sample 3m + 1
    (RationalResampler's positions for 2/3): both from input samples 3m .. 3m + TAPS, one matrix product."""
    step = rows.itemsize
    spans = as_strided(rows, shape=(len(rows), WINDOW // 2, TAPS + 1), strides=(rows.strides[0], 3 * step, step),
                       writeable=False)
    return (spans @ PAIR).reshape(len(rows), WINDOW)


class EngineVad:
    """Silero VAD steps on an engine process's VAD (at EngineClient.vad_endpoint), from one thread at a time: the
    VAD's thread, which waits for each answer.

    A step the engine does not answer within ``timeout_s`` (it is gone, restarting or swamped), or answers with
    an error, runs on ``fallback`` (this process's onnxruntime model: the state is the same array either way),
    and so do the steps of the next ``retry_s`` seconds; then the engine is asked again.
    """

    def __init__(self, endpoint: str, fallback: StepModel, timeout_s: float = 0.2, retry_s: float = 5.0) -> None:
        self.endpoint = endpoint
        self.fallback = fallback
        self._timeout_ms = int(timeout_s * 1000)
        self._retry_s = retry_s
        self._tokens = itertools.count()
        self._down_until = 0.0
        self._socket = zmq.Context.instance().socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(self.endpoint)

    def infer(self, x: Float32Array, state: Float32Array) -> tuple[Float32Array, Float32Array]:
        """One step for B streams: x [B, 576], state [2, B, 128] -> (P(speech) [B], state)."""
        now = time.monotonic()
        if now >= self._down_until:
            try:
                return self._ask(x, state)
            except BackendError as exc:
                log.warning("%s; the VAD runs here for %g s", exc, self._retry_s)
                self._down_until = now + self._retry_s
        return self.fallback.infer(x, state)

    def _ask(self, x: Float32Array, state: Float32Array) -> tuple[Float32Array, Float32Array]:
        token = str(next(self._tokens)).encode()
        rows = len(x)
        try:
            self._socket.send_multipart([token, np.ascontiguousarray(x, dtype="<f4"),
                                         np.ascontiguousarray(state, dtype="<f4")], zmq.NOBLOCK)
        except zmq.Again:
            raise BackendError("vad", f"the engine's VAD at {self.endpoint} does not keep up") from None
        deadline = time.monotonic() + self._timeout_ms / 1000
        while (left := deadline - time.monotonic()) > 0 and self._socket.poll(int(left * 1000) + 1, zmq.POLLIN):
            answer = self._socket.recv_multipart()
            if answer[0] != token:
                continue  # the answer to a step that was given up on
            if answer[1] != ipc.OK or len(answer) != 4:
                raise BackendError("vad", f"the engine's VAD failed: {answer[-1].decode(errors='replace')}")
            probs = np.frombuffer(answer[2], dtype="<f4")
            new_state = np.frombuffer(answer[3], dtype="<f4").reshape(state.shape)
            if len(probs) != rows:
                raise BackendError("vad", "the engine's VAD answered another number of windows")
            return probs, new_state
        raise BackendError("vad", f"the engine's VAD at {self.endpoint} did not answer in {self._timeout_ms} ms")

    def close(self) -> None:
        self._socket.close()


Deliver = Callable[[Float32Array], None]

# The interpreter's switch interval while the VAD's thread serves (the gateway sets it): a thread that asks
# for the GIL gets it within this long, where the default 5 ms let a busy event loop hold up each batch at
# both its takes of the GIL (after its wait, after the model call). Measured with a loop busy in Python: a
# batch's turnaround P95 29-41 ms at 5 ms, 11-12 ms at 1 ms.
SWITCH_INTERVAL_S = 0.001


class VadBatcher:
    """Every session's VAD of one event loop in shared batched model calls, run in ``executor`` (one thread:
    the VAD's own; None: on the loop).

    ``feed`` (on the loop, where a session's audio arrives) queues the input of the windows the audio
    completes; the batch resamples them (``_windows``) and runs them. A batch starts at most every
    ``interval_ms`` and takes every window queued by then, of every session (a session's several windows in
    order, its k-th in step k); its probabilities come back to the loop in one callback per batch, which hands
    each session its own (``deliver``, in order). So a window waits for the batch under way and the interval,
    never for the loop's other work, nor for its session's earlier windows to come back; and a batch of 8+
    streams costs ~48 µs a window instead of ~90 µs.
    """

    def __init__(self, executor: Executor | None = None, interval_ms: float = 0) -> None:
        self._executor = executor
        self._interval = interval_ms / 1000
        self._lock = threading.Lock()
        self._queue: list[tuple[SileroVAD, bytes, Deliver]] = []
        self._armed = False  # a batch is due or under way: what is fed meanwhile joins it or the next
        self._next_at = 0.0  # time.monotonic() of the next batch's earliest start
        # The thread waits out the interval on an event never set: a wait that profilers see as one, where
        # time.sleep looks like work (scripts/cpu_stages.py).
        self._pause = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def feed(self, vad: SileroVAD, pcm24k: bytes, deliver: Deliver) -> int:
        """Queue the windows ``pcm24k`` completes (returned: how many) for the next batch; ``deliver`` gets
        their probabilities on the loop, after those of the session's earlier windows. ``vad.queued``
        counts the session's windows whose probabilities have not been delivered yet."""
        taken = vad.take(pcm24k)
        if not taken:
            return 0
        windows = len(taken) // WINDOW_BYTES
        vad.queued += windows
        with self._lock:
            self._queue.append((vad, taken, deliver))
            if self._armed:
                return windows
            self._armed = True
        loop = self._loop = asyncio.get_running_loop()
        if self._executor is not None:
            self._executor.submit(self._work)
        else:
            loop.call_later(max(0.0, self._next_at - time.monotonic()), self._run_on_loop)
        return windows

    async def process(self, vad: SileroVAD, pcm24k: bytes) -> Float32Array:
        """``vad.process(pcm24k)``, batched with whatever other sessions feed meanwhile."""
        done: asyncio.Future[Float32Array] = asyncio.get_running_loop().create_future()
        if not self.feed(vad, pcm24k, lambda probs: done.done() or done.set_result(probs)):
            return np.empty(0, dtype=np.float32)
        return await done

    def _take(self) -> list[tuple[SileroVAD, bytes, Deliver]]:
        """What is queued, the batcher disarmed when nothing is: the next feed arms it again."""
        with self._lock:
            items, self._queue = self._queue, []
            self._armed = bool(items)
        return items

    def _work(self) -> None:
        """The VAD's thread: batches, each at most every interval, until nothing is queued."""
        assert self._loop is not None
        while True:
            if (wait := self._next_at - time.monotonic()) > 0:
                self._pause.wait(wait)
            self._next_at = time.monotonic() + self._interval
            items = self._take()
            if not items:
                return
            self._loop.call_soon_threadsafe(self._deliver, items, self._run(items))

    def _run_on_loop(self) -> None:
        """Without an executor: the same batches, run on the loop."""
        self._next_at = time.monotonic() + self._interval
        items = self._take()
        if items:
            self._deliver(items, self._run(items))
            asyncio.get_running_loop().call_later(self._interval, self._run_on_loop)

    @staticmethod
    def _run(items: list[tuple[SileroVAD, bytes, Deliver]]) -> list[Float32Array] | BaseException:
        """The batch's probabilities, one array per item; the exception if the model failed."""
        try:
            sessions: dict[SileroVAD, list[int]] = {}
            for k, (vad, _, _) in enumerate(items):
                sessions.setdefault(vad, []).append(k)
            vads = list(sessions)
            if len(sessions) == len(items):  # one item per session: no merging
                return _infer(vads, [taken for _, taken, _ in items])
            merged = _infer(vads, [b"".join(items[k][1] for k in ks) for ks in sessions.values()])
            out: list[Float32Array] = [np.empty(0, dtype=np.float32)] * len(items)
            for probs, ks in zip(merged, sessions.values(), strict=True):
                offset = 0
                for k in ks:
                    n = len(items[k][1]) // WINDOW_BYTES
                    out[k] = probs[offset : offset + n]
                    offset += n
            return out
        except Exception as exc:  # handed to the loop: a broken VAD must not stop the thread
            return exc

    @staticmethod
    def _deliver(items: list[tuple[SileroVAD, bytes, Deliver]],
                 results: list[Float32Array] | BaseException) -> None:
        """On the loop: each session its probabilities (none when the batch failed), in the queue's order."""
        if isinstance(results, BaseException):
            log.error("VAD failed; %d windows of input audio not analysed",
                      sum(len(taken) for _, taken, _ in items) // WINDOW_BYTES, exc_info=results)
            results = [np.empty(0, dtype=np.float32)] * len(items)
        for (vad, taken, deliver), probs in zip(items, results, strict=True):
            vad.queued -= len(taken) // WINDOW_BYTES
            try:
                deliver(probs)
            except Exception:  # one session's failure is not the others'
                log.exception("handling the VAD's probabilities failed")
