"""The session count that `serve --workers N` shares: the limit holds for the gateway across processes
racing for the last slots, and no worker can leave anything held that the others would wait on."""

from __future__ import annotations

import multiprocessing
import os
import signal

from gateway.runtime.capacity import Capacity, Counts, shared_counts

LIMIT = 40


def test_one_process_counts_admits_up_to_the_limit_and_refuses_while_draining() -> None:
    capacity = Capacity(2)
    assert capacity.admit() and capacity.admit() and not capacity.admit()
    assert (capacity.sessions, capacity.free) == (2, 0)
    capacity.release()
    assert capacity.free == 1
    capacity.draining = True
    assert not capacity.admit() and capacity.sessions == 1


def _take(counts: Counts, slot: int, start: multiprocessing.synchronize.Event, taken: multiprocessing.Queue) -> None:
    capacity = Capacity(LIMIT, counts, slot)
    start.wait()
    taken.put((slot, sum(capacity.admit() for _ in range(LIMIT))))


def test_workers_racing_never_hold_more_than_the_limit_together() -> None:
    context = multiprocessing.get_context("spawn")
    counts, start, taken = shared_counts(4), context.Event(), context.Queue()
    workers = [context.Process(target=_take, args=(counts, slot, start, taken)) for slot in range(4)]
    for worker in workers:
        worker.start()
    start.set()
    admitted = [n for _, n in sorted(taken.get(timeout=60) for _ in workers)]
    for worker in workers:
        worker.join(30)
    assert sum(admitted) <= LIMIT
    assert sum(counts[:]) == sum(admitted)  # every refusal stepped back
    assert list(counts[:]) == admitted


def _hold(counts: Counts, ready: multiprocessing.synchronize.Event) -> None:
    capacity = Capacity(LIMIT, counts, 1)
    for _ in range(3):
        capacity.admit()
    ready.set()
    while True:  # admitting and releasing until it is killed, wherever that lands
        capacity.admit()
        capacity.release()


def test_a_worker_killed_outright_leaves_nothing_the_others_wait_on() -> None:
    context = multiprocessing.get_context("spawn")
    counts, ready = shared_counts(2), context.Event()
    worker = context.Process(target=_hold, args=(counts, ready))
    worker.start()
    assert ready.wait(60)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(30)
    assert counts[1] in (3, 4)
    counts[1] = 0  # what the parent does for a dead worker's slot
    survivor = Capacity(LIMIT, counts, 0)
    assert all(survivor.admit() for _ in range(LIMIT)) and not survivor.admit()
