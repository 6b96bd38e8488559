"""A gateway with its SIP endpoint on a free port, answering with the pipeline: the fake LLM's fixed sentence
spoken by piper (the local extra), so that a phone's recording of the answer can be checked by ear (Whisper)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.fake_openai import FakeOpenAI
from tests.phones.baresip import free_sip_port

ANSWER = "The sky is blue because the air scatters blue sunlight the most."


@pytest.fixture
async def phone_gateway(start_gateway: Any) -> Any:
    """Starts a gateway with SIP on a free port, answering with the fake LLM's sentence spoken by piper."""
    from gateway.responders.pipeline import BridgeSettings, PipelineResponder
    from gateway.responders.piper_tts import PiperEngine
    from gateway.responders.remote import LlmClient

    fakes: list[FakeOpenAI] = []
    responders: list[PipelineResponder] = []

    async def start(reply: str = ANSWER, **overrides: Any) -> Any:
        fake = FakeOpenAI(reply=reply, transcript="Why is the sky blue?")
        await fake.start()
        fakes.append(fake)
        responder = PipelineResponder(LlmClient(fake.base_url, "llm-test", timeout_s=5), PiperEngine.shared(),
                                      BridgeSettings(starter_chars=10, max_segment_chars=120))
        responders.append(responder)
        options = {"sip__enabled": True, "sip__port": free_sip_port(), "stt__base_url": fake.base_url,
                   "stt__model": "whisper-test", "calls__noise_reduction": ""}
        return await start_gateway(responder, **options | overrides)

    yield start
    for responder in responders:
        await responder.aclose()
    for fake in fakes:
        await fake.stop()


