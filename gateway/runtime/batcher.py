"""Many sessions' model requests in shared batched calls, from one asyncio event loop (Smart Turn).

A request waits for the next batch: the first request of an idle batcher starts one at once, and requests
that arrive while a batch runs form the next, up to ``max_batch``; so batches grow under load by themselves
and an idle server answers at once. A batch runs in ``executor`` (onnxruntime releases the GIL), or on the
loop without one. Requests whose caller has gone (a session closed) are dropped before their batch runs. A
batch that fails hands its exception to every caller in it; none is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
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
                 max_batch: int = 0) -> None:
        """``run``: one batched call, a result per request in order. ``max_batch`` 0: no cap."""
        self._run = run
        self._executor = executor
        self._max_batch = max_batch
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
        live = [pending for pending in self._queue if not pending.future.done()]  # its caller is still there
        cut = self._max_batch or len(live)
        batch, self._queue = live[:cut], live[cut:]
        return batch

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch = self._take_batch()
                if not batch:
                    continue
                requests = [p.request for p in batch]
                try:
                    if self._executor is None:
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
