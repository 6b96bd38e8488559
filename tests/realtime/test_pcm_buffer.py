"""gateway.realtime.turns.PcmBuffer: the input buffer's bytes, against a bytearray doing the same."""

from __future__ import annotations

import random

from gateway.realtime.turns import CHUNK_BYTES, PcmBuffer


def test_appends_drops_and_slices_read_back_as_a_bytearray_would() -> None:
    rng = random.Random(7)
    for _ in range(100):
        buffer, reference = PcmBuffer(), bytearray()
        for _ in range(150):
            op = rng.random()
            if op < 0.55:  # empty, tiny, 20 ms and longer-than-a-chunk appends
                data = rng.randbytes(rng.choice([0, 1, 7, 960, CHUNK_BYTES + 3000]))
                buffer.append(data)
                reference += data
            elif op < 0.75:
                n = rng.randint(0, len(reference) + 10)
                buffer.drop(n)
                del reference[:n]
            elif op < 0.97:
                begin = rng.randint(0, len(reference) + 5)
                stop = rng.randint(begin, len(reference) + 50)
                assert buffer.get(begin, stop) == reference[begin:stop]
            else:
                buffer.clear()
                reference.clear()
            assert len(buffer) == len(reference)
        assert buffer.get(0, len(reference)) == reference


def test_tiny_appends_take_no_more_room_than_their_bytes() -> None:
    buffer = PcmBuffer()
    for _ in range(10 * CHUNK_BYTES):
        buffer.append(b"\1")
    assert len(buffer._chunks) == 10 and not buffer._tail  # whole chunks, not an object per append
