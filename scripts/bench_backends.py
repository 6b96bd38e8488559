"""CPU the STT and LLM clients cost the event loop, per transcription and per streamed reply.

The fake OpenAI-compatible server (tests/fake_openai.py) runs in its own process with no latency, so
this process's CPU time is the clients' alone: gateway.responders.remote as the gateway runs it, beside the
openai package's plain calls (``audio.transcriptions.create`` and ``chat.completions.create`` on its
default HTTP transport) for comparison. The first call of each client is reported apart: one-off
imports and model builds land there when start-up has not paid them.

    .venv/bin/python scripts/bench_backends.py [--calls 30] [--audio-s 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import openai

from gateway.audio import wav_bytes
from gateway.core.responder import Message, transcript_of
from gateway.responders.remote import LlmClient, SttClient, chat_messages

ROOT = Path(__file__).resolve().parent.parent

REPLY = "Sure. The weather tomorrow looks sunny with a light breeze, and it should stay warm until the evening."
CONVERSATION = [
    Message("u1", "user", "What is the weather like tomorrow?"),
    Message("a1", "assistant", "Mostly sunny, with a light breeze."),
    Message("u2", "user", "And in the evening?"),
]


async def measure(call: Callable[[], Awaitable[object]], calls: int) -> tuple[float, float, float]:
    """(first call's CPU ms, median CPU ms and median wall ms of the next ``calls``)."""
    cpu0 = time.process_time()
    await call()
    first = (time.process_time() - cpu0) * 1000
    cpu, wall = [], []
    for _ in range(calls):
        c, w = time.process_time(), time.perf_counter()
        await call()
        cpu.append((time.process_time() - c) * 1000)
        wall.append((time.perf_counter() - w) * 1000)
    return first, statistics.median(cpu), statistics.median(wall)


async def run(base_url: str, calls: int, audio_s: float) -> None:
    pcm = bytes(int(24000 * audio_s) * 2)
    messages = chat_messages("You are a helpful voice assistant.", CONVERSATION)

    stt, llm = SttClient(base_url, "whisper"), LlmClient(base_url, "llm")
    await asyncio.gather(stt.check(), llm.check())  # what the gateway does at start-up

    async def gateway_chat() -> None:
        async for _ in llm.stream_chat(messages):
            pass

    sdk = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)

    async def sdk_stt() -> None:
        await sdk.audio.transcriptions.create(file=("audio.wav", wav_bytes(pcm), "audio/wav"), model="whisper")

    async def sdk_chat() -> None:
        stream = await sdk.chat.completions.create(model="llm", messages=messages, stream=True)  # type: ignore[arg-type]
        async for _ in stream:
            pass

    rows = [
        (f"transcription, {audio_s:g} s of audio", "gateway.responders.remote", lambda: transcript_of(stt, pcm)),
        ("", "openai, default transport", sdk_stt),
        (f"chat stream, {len(REPLY.split()) + 2} chunks", "gateway.responders.remote", gateway_chat),
        ("", "openai, default transport", sdk_chat),
    ]
    print(f"\nbench_backends ({calls} calls each, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    print("call | client | first call CPU ms | CPU ms per call (median) | wall ms per call (median)")
    for what, client, call in rows:
        first, cpu, wall = await measure(call, calls)
        print(f"{what} | {client} | {first:.1f} | {cpu:.2f} | {wall:.2f}")
    await asyncio.gather(stt.aclose(), llm.aclose(), sdk.close())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=30, help="calls measured per row, after the first")
    parser.add_argument("--audio-s", type=float, default=3.0, help="seconds of audio per transcription")
    parser.add_argument("--port", type=int, default=18190)
    args = parser.parse_args()
    fake = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_openai", "--port", str(args.port), "--reply", REPLY],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        fake.stdout.readline()  # "listening on ..."
        asyncio.run(run(f"http://127.0.0.1:{args.port}/v1", args.calls, args.audio_s))
    finally:
        fake.terminate()
        fake.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
