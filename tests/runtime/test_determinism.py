"""The same audio gives the same turns and the same transcript whether its session is alone or shares the
server with others: one WAV from one session, then from four at once, through a real gateway (batched
Silero VAD, early transcription, the local whisper in its model thread) and the unmodified openai SDK.

Where a difference could come from, each measured bit for bit on this machine: the VAD's batched calls
(tests/runtime/test_vad.py: a stream's probabilities do not depend on the batch it shares), its chunking
(the runner hands the VAD whatever audio piled up meanwhile: the same), the local whisper under load (its
encoder's output is the same with the CPU busy), early transcription (it transcribes the very bytes the
turn commits, or its result is not used). What this gateway cannot make the same is a remote STT server
that batches concurrent requests on a GPU: its numerics may depend on the batch (vLLM has a
batch-invariant mode for that).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.responders.build import LOCAL_STT, installed
from tests.conftest import StartGateway, connect, load_pcm, silence

pytestmark = pytest.mark.skipif(not installed(LOCAL_STT), reason="the local STT is not installed (the local extra)")

TURN_EVENTS = ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped")
TRANSCRIBED = "conversation.item.input_audio_transcription.completed"


async def heard(gateway: Any, pcm: bytes) -> tuple[list[tuple[str, int]], list[str]]:
    """A transcription session's turn boundaries and transcripts for ``pcm``, sent as fast as it goes."""
    async with connect(gateway, transcription=True) as client:
        await client.send({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "transcription": {"model": "whisper-1"}}}}})
        await client.until("session.updated")
        await client.append(pcm, chunk_ms=100)
        events = []
        while sum(e["type"] == TRANSCRIBED for e in events) < 2:
            events.append(await client.recv(60))
    turns = [(e["type"], e.get("audio_start_ms", e.get("audio_end_ms"))) for e in events if e["type"] in TURN_EVENTS]
    return turns, [e["transcript"] for e in events if e["type"] == TRANSCRIBED]


async def test_one_wav_gives_the_same_turns_and_words_alone_and_among_four(start_gateway: StartGateway):
    gateway = await start_gateway(local__stt=True)
    pcm = load_pcm("two_turns.wav") + silence(1000)
    alone = await heard(gateway, pcm)
    assert len(alone[0]) == 4 and all(alone[1]), alone
    together = await asyncio.gather(*(heard(gateway, pcm) for _ in range(4)))
    assert together == [alone] * 4
