"""Pipecat's ``OpenAILiveLLMService`` (pipecat-ai 1.14, unmodified) against a real gateway on loopback, in a pipeline
fed with recorded speech at real-time pace: Responses delegation with a function tool Pipecat runs, and client
delegation with a ``BackendLLMWorker`` (Pipecat's own chat-completions service on the fake server) as the backend.

The gateway's voice model is the pipeline on the fake OpenAI server (real HTTP), the tone engine its TTS."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("pipecat.services.openai.live")

from pipecat.adapters.schemas.function_schema import FunctionSchema  # noqa: E402
from pipecat.adapters.schemas.tools_schema import ToolsSchema  # noqa: E402
from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    Frame,
    InputAudioRawFrame,
    LLMContextFrame,
    SpeechOutputAudioRawFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineWorker  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.openai.live.llm import OpenAILiveLLMService  # noqa: E402
from pipecat.services.openai.llm import OpenAILLMService  # noqa: E402
from pipecat.services.openai.responses.llm import OpenAIResponsesLLMService  # noqa: E402
from pipecat.workers.llm.backend_llm_worker import BackendLLMWorker  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from bench.fake_openai import Call, FakeOpenAI, Script  # noqa: E402
from tests.conftest import load_pcm, silence  # noqa: E402
from tests.helpers.live import WEATHER, backend  # noqa: E402

pytestmark = pytest.mark.asyncio


class Recorder(FrameProcessor):
    """The pipeline's end: what the service pushed downstream."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []
        self.speech = bytearray()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, SpeechOutputAudioRawFrame):
            self.speech += frame.audio
        else:
            self.frames.append(frame)
        await self.push_frame(frame, direction)


async def speak(worker: PipelineWorker, pcm: bytes, seconds: float) -> None:
    """Recorded speech into the pipeline as a microphone gives it: 20 ms frames at real time, then silence."""
    loop = asyncio.get_running_loop()
    start, sent = loop.time(), 0
    frames = int(seconds * 50)
    for n in range(frames):
        chunk = pcm[n * 960:(n + 1) * 960].ljust(960, b"\0")
        await worker.queue_frames([InputAudioRawFrame(audio=chunk, sample_rate=24000, num_channels=1)])
        sent += 1
        await asyncio.sleep(max(0.0, start + sent * 0.02 - loop.time()))


async def run(llm: OpenAILiveLLMService, context: LLMContext, speech: bytes, seconds: float,
              extra: list[Any] | None = None) -> Recorder:
    recorder = Recorder()
    worker = PipelineWorker(Pipeline([llm, recorder]), cancel_on_idle_timeout=False, check_dangling_tasks=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(*(extra or []), worker)
    running = asyncio.create_task(runner.run())
    await worker.queue_frames([LLMContextFrame(context)])
    await speak(worker, speech, seconds)
    await worker.queue_frames([EndFrame()])
    await asyncio.wait_for(running, 30)
    return recorder


async def test_responses_delegation_runs_pipecats_function(start_pipeline: Any) -> None:
    async with FakeOpenAI(reply=backend, transcript="What's the weather in Paris?") as fake:
        gateway = await start_pipeline(fake, llm__base_url=fake.base_url)
        calls: list[dict[str, Any]] = []

        async def get_weather(params: Any) -> None:
            calls.append(dict(params.arguments))
            await params.result_callback({"sky": "sunny"})

        llm = OpenAILiveLLMService(
            api_key="test-key", base_url=f"ws://127.0.0.1:{gateway.port}/v1/live/sessions",
            settings=OpenAILiveLLMService.Settings(system_instruction="Be brief."),
            delegation=OpenAILiveLLMService.ResponsesDelegation(
                settings=OpenAIResponsesLLMService.Settings(model="gpt-5.6-terra")))
        llm.register_function("get_weather", get_weather)
        tools = ToolsSchema(standard_tools=[FunctionSchema(
            name="get_weather", description=WEATHER["description"], properties={"city": {"type": "string"}},
            required=["city"])])
        context = LLMContext([{"role": "system", "content": "Be brief."}], tools=tools)
        recorder = await run(llm, context, load_pcm("question_sky.wav"), 14.0)
    assert calls == [{"city": "Paris"}]
    outputs = [r for r in fake.responses_requests if any(i.get("type") == "function_call_output"
                                                         for i in r.body["input"])]
    assert outputs and '"sunny"' in str(outputs[0].body["input"])
    assert any(recorder.speech)  # the voice model said the answer aloud
    said = "".join(getattr(f, "text", "") for f in recorder.frames if type(f).__name__ == "LLMTextFrame")
    assert said == "Okay, checking now. It is sunny in Paris."  # our output transcript, as Pipecat's text


async def test_client_delegation_with_a_backend_worker(start_pipeline: Any) -> None:
    def replies(body: dict[str, Any]) -> str | Script:
        system = body["messages"][0]["content"] if body["messages"] else ""
        if "voice of a live spoken conversation" not in system:  # Pipecat's backend
            return "The staging cluster is healthy."
        last = body["messages"][-1]
        if last["role"] == "system" and "in your own words" in last["content"]:
            return "Staging is healthy."
        return Script("One moment.", [Call("delegate", {"task": "check staging"})])

    async with FakeOpenAI(reply=replies, transcript="Please check the staging status.") as fake:
        gateway = await start_pipeline(fake)
        backend_worker = BackendLLMWorker(llm=OpenAILLMService(
            api_key="none", base_url=fake.base_url, settings=OpenAILLMService.Settings(model="backend-llm")))
        llm = OpenAILiveLLMService(
            api_key="test-key", base_url=f"ws://127.0.0.1:{gateway.port}/v1/live/sessions",
            delegation=OpenAILiveLLMService.ClientDelegation(backend=backend_worker, timeout_secs=20))
        delegations: list[Any] = []
        llm.event_handler("on_delegation_created")(lambda service, item: delegations.append(item))
        context = LLMContext([{"role": "system", "content": "Delegate checks to the client."}])
        recorder = await run(llm, context, load_pcm("question_sky.wav") + silence(100), 16.0)
    assert len(delegations) == 1 and delegations[0].target == "client"
    backend_requests = [r for r in fake.chat_requests if r.body["model"] == "backend-llm"]
    assert backend_requests and "staging" in str(backend_requests[0].messages).lower()
    voice = [r for r in fake.chat_requests if r.body["model"] == "llm-test"]
    assert any("staging cluster is healthy" in str(r.messages) for r in voice)  # Pipecat's commentary reached it
    assert any(recorder.speech)
