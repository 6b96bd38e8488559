"""The counts the phone lines' bounds share under `serve --workers N` (gateway.runtime.tally), and call ids that name
their worker: processes racing for the last places never hold more than the bounds together, a worker's
freed places are seen by the others, a dead worker's row is cleared, a token is used once in all."""

from __future__ import annotations

import multiprocessing
import re
import time
from multiprocessing.synchronize import Event

from gateway.runtime.tally import Array, Seen, Tally, clear_row, shared_seen, shared_tally
from gateway.transports.calls.workers import new_call_id, slot_of

KEY = b"k" * 32
LIMIT, PER_SOURCE = 30, 12


def test_the_bounds_hold_across_workers_and_freed_places_are_seen() -> None:
    array = shared_tally(2)
    held: list[list[str]] = [[], []]
    tallies = [Tally(lambda w=w: held[w], array, 2, w, KEY) for w in (0, 1)]

    def take(worker: int, source: str) -> bool:
        if tallies[worker].admit(source, 4, 2) is None:
            held[worker].append(source)
            return True
        return False

    assert take(0, "10.0.0.1") and take(1, "10.0.0.1")
    full = tallies[0].admit("10.0.0.1", 4, 2)  # the source's share is taken, one call in each worker
    assert full is not None and full.source and not full.total
    assert take(0, "10.0.0.2") and take(1, "10.0.0.3")
    full = tallies[1].admit("10.0.0.4", 4, 2)
    assert full is not None and full.total
    held[0].clear()
    tallies[0].refresh()  # worker 0's calls ended: worker 1 sees their places free
    assert take(1, "10.0.0.1") and take(1, "10.0.0.4")
    clear_row(array, 1)  # worker 1 died with its calls
    assert tallies[0].admit("10.0.0.1", 4, 2) is None


def test_one_process_counts_its_own_sources_exactly() -> None:
    held: list[str] = []
    tally = Tally(lambda: held)
    for _ in range(2):
        assert tally.admit("10.0.0.1", 3, 2) is None
        held.append("10.0.0.1")
    assert tally.admit("10.0.0.1", 3, 2) is not None
    assert tally.admit("10.0.0.2", 3, 2) is None


def _take(array: Array, slot: int, start: Event, taken: multiprocessing.Queue) -> None:
    held: list[str] = []
    tally = Tally(lambda: held, array, 4, slot, KEY)
    start.wait()
    for _ in range(LIMIT):
        if tally.admit("10.0.0.1" if len(held) % 2 else "10.0.0.2", LIMIT, PER_SOURCE) is None:
            held.append("10.0.0.1" if len(held) % 2 else "10.0.0.2")
    taken.put(held)


def test_workers_racing_never_hold_more_than_the_bounds_together() -> None:
    context = multiprocessing.get_context("spawn")
    array, start, taken = shared_tally(4), context.Event(), context.Queue()
    workers = [context.Process(target=_take, args=(array, slot, start, taken)) for slot in range(4)]
    for worker in workers:
        worker.start()
    start.set()
    held = [source for _ in workers for source in taken.get(timeout=60)]
    for worker in workers:
        worker.join(30)
    assert len(held) <= LIMIT
    assert held.count("10.0.0.1") <= PER_SOURCE and held.count("10.0.0.2") <= PER_SOURCE


def test_a_token_is_used_once_in_all_the_workers() -> None:
    array = shared_seen(3)
    seen = [Seen(array, 3, w) for w in range(3)]
    later = time.time() + 30
    assert seen[0].use(b"a", later)
    assert not seen[0].use(b"a", later) and not seen[2].use(b"a", later)
    assert seen[1].use(b"b", later) and not seen[0].use(b"b", later)
    assert seen[2].use(b"expired", time.time() - 1)  # an expired entry is no one's (the token's own check refuses)
    assert seen[0].use(b"expired", later)
    alone = Seen()
    assert alone.use(b"a", later) and not alone.use(b"a", later)


def test_a_call_id_names_its_worker_and_looks_like_any_other() -> None:
    for slot in (0, 1, 11, 300):
        ids = {new_call_id(slot) for _ in range(200)}
        assert len(ids) == 200 and all(re.fullmatch(r"rtc_[0-9a-f]{24}", i) and slot_of(i) == slot for i in ids)
        assert len({i[4:8] for i in ids}) > 150 and len({i[-4:] for i in ids}) > 150  # no fixed digits
    assert slot_of("rtc_" + "g" * 24) is None and slot_of("sess_123") is None
