"""The shared model thread: sessions take turns step by step, a closed consumer leaves the queue at once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from gateway.responders.model_thread import ModelThread, current_session


def steps(name: str, n: int, log: list[str]) -> Iterator[str]:
    for i in range(n):
        log.append(f"{name}{i}")
        yield f"{name}{i}"


async def as_session(session: str, coro):
    current_session.set(session)  # this task's own context
    return await coro


async def drain(worker: ModelThread, it: Iterator[str]) -> list[str]:
    return [value async for value in worker.stream(it)]


async def hold(worker: ModelThread) -> tuple[asyncio.Task[bool], threading.Event]:
    """A job of session "x" that keeps the thread until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def block() -> bool:
        started.set()
        return release.wait()

    task = asyncio.create_task(as_session("x", worker.call(block)))
    assert await asyncio.to_thread(started.wait, 5)
    return task, release


async def test_sessions_take_turns_step_by_step_not_job_by_job():
    worker = ModelThread("test")
    log: list[str] = []
    # The thread is held while the jobs queue, so the order below is the queue's.
    blocker, release = await hold(worker)
    a1 = asyncio.create_task(as_session("a", drain(worker, steps("a", 3, log))))
    a2 = asyncio.create_task(as_session("a", drain(worker, steps("A", 1, log))))
    b = asyncio.create_task(as_session("b", drain(worker, steps("b", 2, log))))
    while worker.queued() < 3:
        await asyncio.sleep(0.001)
    release.set()
    assert await a1 == ["a0", "a1", "a2"] and await a2 == ["A0"] and await b == ["b0", "b1"]
    # a's generation steps alternate with b's; a's second job waits for a's first, not for b.
    assert log == ["a0", "b0", "a1", "b1", "a2", "A0"]
    assert await blocker


async def test_a_cancelled_queued_job_leaves_the_queue_at_once_and_never_runs():
    worker = ModelThread("test")
    ran: list[str] = []
    blocker, release = await hold(worker)
    queued = asyncio.create_task(as_session("b", worker.call(ran.append, "b")))
    while worker.queued() == 0:
        await asyncio.sleep(0.001)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert worker.queued() == 0  # gone before the thread is free again
    release.set()
    await blocker
    assert await as_session("c", worker.call(ran.append, "c")) is None
    assert ran == ["c"]


async def test_closing_a_stream_stops_its_generator_at_the_next_step():
    worker = ModelThread("test")
    closed = threading.Event()

    def endless() -> Iterator[int]:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    stream = worker.stream(endless())
    assert [await anext(stream) for _ in range(3)] == [0, 1, 2]
    await stream.aclose()
    assert await asyncio.to_thread(closed.wait, 5)
    assert worker.queued() == 0


async def test_an_error_in_a_step_reaches_the_caller_and_the_thread_goes_on():
    worker = ModelThread("test")
    with pytest.raises(ZeroDivisionError):
        await worker.call(lambda: 1 / 0)
    assert await worker.call(lambda: 42) == 42
