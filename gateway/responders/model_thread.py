"""One thread per in-process model, shared by all sessions, taking their work round-robin.

A job is an iterator whose steps run in the model's thread: a single call is one step (a
transcription, a sentence of speech), a generation is one step per token. After each step the thread
moves to the next session that has work, so a session with many queued jobs (or a long generation)
delays another session by one step, never by its whole backlog, and generations of two sessions
advance token by token, side by side.

The session is ``current_session`` (a context variable the session runner sets for its tasks).
Closing the consumer (a cancelled response) drops its job from the queue at once; a step already
running finishes and its result is discarded.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from contextlib import aclosing
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

# The session on whose behalf model work is queued (None: work outside any session, e.g. a warm-up).
current_session: ContextVar[Hashable | None] = ContextVar("current_session", default=None)

_VALUE, _END, _ERROR = range(3)


@dataclass(eq=False)
class _Job:
    steps: Iterator[Any]
    key: Hashable | None
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[tuple[int, Any]] = field(default_factory=asyncio.Queue)
    running: bool = False
    dropped: bool = False


def _once(fn: Callable[..., T], args: tuple[Any, ...]) -> Iterator[T]:
    yield fn(*args)


class ModelThread:
    def __init__(self, name: str) -> None:
        self.name = name
        # Sessions with queued jobs, in round-robin order; each session's jobs in its own order.
        self._queues: OrderedDict[Hashable | None, deque[_Job]] = OrderedDict()
        self._lock = threading.Condition()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def queued(self) -> int:
        """Jobs waiting for the thread (not the one running)."""
        with self._lock:
            return sum(len(jobs) for jobs in self._queues.values())

    def queued_sessions(self) -> set[Hashable | None]:
        """The sessions with jobs waiting for the thread."""
        with self._lock:
            return set(self._queues)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the model's thread, in its session's turn."""
        async with aclosing(self.stream(_once(fn, args))) as results:
            async for result in results:
                return result
        raise AssertionError("a call yields once")

    async def stream(self, steps: Iterator[T]) -> AsyncIterator[T]:
        """The values of ``steps``, each computed in the model's thread in its session's turn."""
        job = _Job(steps, current_session.get(), asyncio.get_running_loop())
        with self._lock:
            self._queues.setdefault(job.key, deque()).append(job)
            self._lock.notify()
        try:
            while True:
                kind, value = await job.out.get()
                if kind == _END:
                    return
                if kind == _ERROR:
                    raise value
                yield value
        finally:
            self._drop(job)

    def _drop(self, job: _Job) -> None:
        with self._lock:
            job.dropped = True
            jobs = self._queues.get(job.key)
            if jobs is not None and job in jobs:
                jobs.remove(job)
                if not jobs:
                    del self._queues[job.key]
            running = job.running
        if not running:  # else the thread closes it after its step
            self._close(job)

    @staticmethod
    def _close(job: _Job) -> None:
        close = getattr(job.steps, "close", None)
        if close is not None:
            close()  # a generator's cleanup (its KV cache) runs now, not at garbage collection

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queues:
                    self._lock.wait()
                key, jobs = next(iter(self._queues.items()))
                job = jobs.popleft()
                if jobs:
                    self._queues.move_to_end(key)  # the other sessions go first
                else:
                    del self._queues[key]
                job.running = True
            try:
                kind, value = _VALUE, next(job.steps)
            except StopIteration:
                kind, value = _END, None
            except Exception as exc:  # the consumer raises it
                kind, value = _ERROR, exc
            with self._lock:
                job.running = False
                if not job.dropped and kind == _VALUE:
                    # Its next step: first among its session's jobs, its session last in the round.
                    self._queues.setdefault(key, deque()).appendleft(job)
            if job.dropped:
                self._close(job)
                continue
            try:
                job.loop.call_soon_threadsafe(job.out.put_nowait, (kind, value))
            except RuntimeError:  # the consumer's loop is closed
                self._drop(job)
