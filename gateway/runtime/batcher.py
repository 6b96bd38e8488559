"""Many sessions' model requests in shared batched calls, from one asyncio event loop (VAD and Smart Turn).

A request waits for the next batch: the first request of an idle batcher starts one at once, and requests
that arrive while a batch runs (or within ``interval_s`` of the last one's start) form the next, up to
``max_batch``; so batches grow under load by themselves and an idle server answers at once. A batch runs on
the loop when ``inline`` says it is small enough, else in ``executor`` (onnxruntime releases the GIL), so
the loop never waits on a large one.

Keyed requests (``key``: a session's VAD) run in order, one per key and batch, because each carries the
state the next one continues from. Unkeyed requests whose caller has gone (a session closed) are dropped
before their batch runs. A batch that fails hands its exception to every caller in it; none is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Generic, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")


@dataclass
class _Pending(Generic[Request, Result]):
    request: Request
    future: asyncio.Future[Result]


class MicroBatcher(Generic[Request, Result]):
    def __init__(self, run: Callable[[list[Request]], Sequence[Result]], executor: Executor | None, *,
                 max_batch: int = 0, interval_s: float = 0.0, key: Callable[[Request], Hashable] | None = None,
                 inline: Callable[[list[Request]], bool] | None = None) -> None:
        """``run``: one batched call, a result per request in order. ``max_batch`` 0: no cap. Without an
        ``executor`` every batch runs on the loop; with one, only those ``inline`` accepts."""
        self._run = run
        self._executor = executor
        self._max_batch = max_batch
        self._interval = interval_s
        self._key = key
        self._inline = inline
        self._next_batch_at = 0.0
        self._queue: list[_Pending[Request, Result]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, request: Request) -> Result:
        """The request's result, once the batch it joins has run."""
        loop = asyncio.get_running_loop()
        pending: _Pending[Request, Result] = _Pending(request, loop.create_future())
        self._queue.append(pending)
        if self._task is None:
            # A task, not a direct call: requests made in this loop iteration join the first batch.
            self._task = loop.create_task(self._drain())
        return await pending.future

    def _take_batch(self) -> list[_Pending[Request, Result]]:
        batch: list[_Pending[Request, Result]] = []
        later: list[_Pending[Request, Result]] = []
        seen: set[Hashable] = set()
        for pending in self._queue:
            if self._max_batch and len(batch) >= self._max_batch:
                later.append(pending)
            elif self._key is not None:
                key = self._key(pending.request)
                (later if key in seen else batch).append(pending)
                seen.add(key)
            elif not pending.future.done():  # its caller is still there
                batch.append(pending)
        self._queue = later
        return batch

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                if (wait := self._next_batch_at - loop.time()) > 0:
                    await asyncio.sleep(wait)
                self._next_batch_at = loop.time() + self._interval
                batch = self._take_batch()
                if not batch:
                    continue
                requests = [p.request for p in batch]
                try:
                    if self._executor is None or (self._inline is not None and self._inline(requests)):
                        results = self._run(requests)
                    else:
                        results = await loop.run_in_executor(self._executor, self._run, requests)
                except Exception as exc:
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(exc)
                    continue
                for pending, result in zip(batch, results, strict=True):
                    if not pending.future.done():  # the caller may have been cancelled (session closed)
                        pending.future.set_result(result)
        finally:
            self._task = None
