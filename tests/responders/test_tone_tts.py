import asyncio

import pytest

from engine.api import TTSChunk, TTSError
from gateway.audio import SAMPLE_RATE
from gateway.responders.tone_tts import ToneEngine, tone_pcm


async def collect(stream) -> list[TTSChunk]:
    return [chunk async for chunk in stream]


async def test_segments_give_deterministic_audio_of_speech_length():
    engine = ToneEngine(first_audio_ms=0, chunk_ms=40)
    stream = engine.open("alloy")
    stream.feed("Hello there.")
    stream.feed("Bye.")
    stream.end()
    chunks = await collect(stream)
    assert [c.text for c in chunks if c.text] == ["Hello there.", "Bye."]
    assert chunks[0].text == "Hello there."
    pcm = b"".join(c.pcm for c in chunks)
    assert pcm == tone_pcm("Hello there.") + tone_pcm("Bye.")
    assert len(pcm) == 16 * SAMPLE_RATE * 2 * 60 // 1000  # 60 ms per character
    assert all(len(c.pcm) <= SAMPLE_RATE * 2 * 40 // 1000 for c in chunks)
    assert tone_pcm("ab") != tone_pcm("ba")


async def test_feed_while_iterating_and_empty_text():
    engine = ToneEngine(first_audio_ms=0)
    stream = engine.open("alloy")
    with pytest.raises(TTSError):
        stream.feed("  ")
    task = asyncio.create_task(collect(stream))
    await asyncio.sleep(0.01)
    assert not task.done()  # waits for text
    stream.feed("Hi.")
    stream.end()
    chunks = await asyncio.wait_for(task, 5)
    assert chunks[0].text == "Hi."
    with pytest.raises(TTSError):
        stream.feed("late")


async def test_cancel_during_first_audio_delay_stops_at_once():
    engine = ToneEngine(first_audio_ms=60_000)
    stream = engine.open("alloy")
    stream.feed("This would take a minute to start.")
    task = asyncio.create_task(collect(stream))
    await asyncio.sleep(0.01)
    stream.cancel()
    assert await asyncio.wait_for(task, 2) == []


async def test_cancel_mid_stream_stops_at_once():
    engine = ToneEngine(first_audio_ms=0, chunk_ms=40, realtime=True)
    stream = engine.open("alloy")
    stream.feed("A long sentence that would play for several seconds at real time." * 3)
    stream.end()
    received = []
    async for chunk in stream:
        received.append(chunk)
        if len(received) == 2:
            stream.cancel()
    assert len(received) == 2


async def test_cancel_while_waiting_for_text_ends_iteration():
    stream = ToneEngine().open("alloy")
    task = asyncio.create_task(collect(stream))
    await asyncio.sleep(0.01)
    stream.cancel()
    assert await asyncio.wait_for(task, 2) == []
    assert stream.cancelled
