"""LiveKit Agents' GPT-Live plugin (livekit-plugins-openai 1.8.9's ``GPTLiveModel``, unmodified) against a real gateway
on loopback, driven as the agents framework drives a duplex model (configured once, audio pushed in 100 ms frames at
real time, its output stream read): client delegation answered with ``append_commentary``, and Responses delegation
whose function call the framework answers with its output item."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

pytest.importorskip("livekit.plugins.openai.realtime")

from livekit import rtc  # noqa: E402
from livekit.agents import llm  # noqa: E402
from livekit.plugins.openai.realtime.gpt_live_model import GPTLiveModel  # noqa: E402

from bench.fake_openai import FakeOpenAI  # noqa: E402
from tests.conftest import load_pcm  # noqa: E402
from tests.helpers.live import backend, voice_model  # noqa: E402

pytestmark = pytest.mark.asyncio


async def converse(session: Any, speech: bytes, seconds: float, heard: bytearray) -> None:
    """Speech then silence into the session at real time, its output audio collected meanwhile."""
    async def listen() -> None:
        async for frame in session.audio_stream:
            heard.extend(bytes(frame.frame.data) if hasattr(frame, "frame") else bytes(frame.data))

    listener = asyncio.create_task(listen())
    loop = asyncio.get_running_loop()
    start = loop.time()
    for n in range(int(seconds * 10)):
        chunk = speech[n * 4800:(n + 1) * 4800].ljust(4800, b"\0")
        session.push_audio(rtc.AudioFrame(chunk, 24000, 1, 2400))
        await asyncio.sleep(max(0.0, start + (n + 1) * 0.1 - loop.time()))
    listener.cancel()
    await asyncio.gather(listener, return_exceptions=True)


async def test_client_delegation(start_pipeline: Any) -> None:
    async with FakeOpenAI(reply=voice_model, transcript="Please check the staging status.") as fake:
        gateway = await start_pipeline(fake)
        model = GPTLiveModel(api_key="test-key", base_url=f"http://127.0.0.1:{gateway.port}/v1",
                             delegation="client")
        session = model.session()
        delegations: list[Any] = []

        def delegated(delegation: Any) -> None:
            delegations.append(delegation)
            session.append_commentary("Staging is healthy.", delegation_id=delegation.id)

        session.on("delegation_created", delegated)
        await session._update_session(instructions="Delegate checks to the client.", tools=[])
        heard = bytearray()
        await converse(session, load_pcm("question_sky.wav"), 12.0, heard)
        await session.aclose()
        await model.aclose()
    assert len(delegations) == 1 and delegations[0].id.startswith("item_")
    assert any(np.frombuffer(bytes(heard), dtype=np.int16))
    prompts = [m["content"] for r in fake.chat_requests for m in r.messages if m["role"] == "system"]
    assert any("Staging is healthy." in p for p in prompts)  # the commentary reached the voice model


async def test_responses_delegation_with_a_function_tool(start_pipeline: Any) -> None:
    async with FakeOpenAI(reply=backend, transcript="What's the weather in Paris?") as fake:
        gateway = await start_pipeline(fake, llm__base_url=fake.base_url)
        model = GPTLiveModel(api_key="test-key", base_url=f"http://127.0.0.1:{gateway.port}/v1",
                             delegation="responses", responses_options={"model": "gpt-5.6-terra"})
        session = model.session()
        calls: list[Any] = []

        def called(call: Any) -> None:
            calls.append(call)
            output = llm.FunctionCallOutput(call_id=call.call_id, name=call.name, output='{"sky": "sunny"}',
                                            is_error=False)
            asyncio.get_running_loop().create_task(session._append_items([output]))

        session.on("function_call", called)

        @llm.function_tool
        async def get_weather(city: str) -> str:
            """The weather in a city."""
            return "sunny"

        await session._update_session(instructions="Be brief.", tools=[get_weather])
        heard = bytearray()
        await converse(session, load_pcm("question_sky.wav"), 14.0, heard)
        await session.aclose()
        await model.aclose()
    assert [c.name for c in calls] == ["get_weather"]
    continued = [r for r in fake.responses_requests
                 if any(i.get("type") == "function_call_output" for i in r.body["input"])]
    assert continued and '"sunny"' in str(continued[0].body["input"])
    voice = [r for r in fake.chat_requests if r.body["model"] == "llm-test"]
    assert any("It is sunny in Paris." in str(r.messages) for r in voice)
