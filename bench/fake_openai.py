"""A fake OpenAI-compatible STT + LLM server: real HTTP on loopback, for tests and benchmarks (the remote
model servers neither can run here).

It serves POST /v1/chat/completions (streamed as SSE in OpenAI's chunk format, or whole), POST /v1/responses
(the Responses API's streaming events, as OpenAI sends them; off with ``responses_api=False``: a 404, as a
server without it answers) and
POST /v1/audio/transcriptions (multipart; with ``stt_streams``, a request with stream=true is answered
as OpenAI's gpt-4o-transcribe does: SSE transcript.text.delta events, then transcript.text.done with
the text and token usage; without it the flag is ignored and the text comes whole, as whisper servers
do), with configurable latency, token rate, reply text and failures, and records every request and
whether the client closed a stream before it finished.
A reply may call tools (``Script``): streamed as vLLM and OpenAI stream them, each call's id and name
first, then its arguments in pieces, one token's time each, and ``finish_reason: "tool_calls"``.

In tests: ``fake = FakeOpenAI(reply="Hello."); await fake.start(); ...; await fake.stop()``
(``fake.base_url`` is what a client's base_url should be). Standalone, for benchmarks:
``python -m bench.fake_openai --port 8100 --stt-ms 100 --ttft-ms 80 --tokens-per-s 50``; it prints
``listening on <base_url>`` once it accepts connections. With ``--reuse-port`` several such processes serve one
port (SO_REUSEPORT: the kernel spreads the connections), so that the fake is never what a benchmark measures;
``--stats FILE`` has each append, once a second, what it saw itself: its event loop's lag (a 10 ms timer, how
late it fires), each answer's latency from its request's arrival to its first bytes (the transcript, the first
token: what its fixed ``--stt-ms`` and ``--ttft-ms`` promise), and the most requests it held at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import re
import signal
import time
import uuid
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from bench.stats import lag_probe, pin

# Failure modes, for the chat or the transcription endpoint:
#   "500"   answer HTTP 500 with an OpenAI error body
#   "break" drop the connection after ``fail_after_tokens`` tokens (0: before any response)
#   "hang"  stop sending after ``fail_after_tokens`` tokens (0: before the response headers)
#   "garbage" (chat only) send an event that is not a chunk object after ``fail_after_tokens`` tokens
FAILURES = ("500", "break", "hang", "garbage")

# Tokens as an LLM streams them: one CJK character, or a word with its leading whitespace.
_TOKEN = re.compile(
    r"\s*[\u3000-\u30ff\u3400-\u9fff\uf900-\ufaff\uff00-\uffef]|\s*[^\s\u3000-\u30ff\u3400-\u9fff\uf900-\ufaff\uff00-\uffef]+|\s+"
)


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


@dataclass
class Recorded:
    """One request as the server saw it."""

    path: str
    body: dict[str, Any]  # chat: the JSON body; transcription: the form fields (file -> its WAV's pcm)
    tokens_sent: int = 0
    finished: bool = False  # the whole response was sent
    closed_by_client: bool = False  # the client went away before the response was finished
    dropped: bool = False  # the server dropped the connection (failure "break")
    done: asyncio.Event = field(default_factory=asyncio.Event)  # finished or closed_by_client

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body.get("messages", [])


@dataclass
class Call:
    """A tool call in a scripted reply."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None  # the server's id for it; None: a new one (some servers number calls anew each turn)


@dataclass
class Script:
    """A reply that says ``text`` (maybe nothing), then makes ``calls`` (parallel calls: several)."""

    text: str = ""
    calls: list[Call] = field(default_factory=list)


Reply = str | Script | Callable[[dict[str, Any]], str | Script]


def delegating(reply: str, task: str = "check the staging status") -> Callable[[dict[str, Any]], str | Script]:
    """A GPT-Live voice model (``--delegate``): a request offering the ``delegate`` tool whose last message is the
    user's delegates ``task`` without a word, a note it is told to speak ("... in your own words: TEXT") is TEXT,
    anything else (a Realtime session's turns among them) is ``reply``."""

    def answer(body: dict[str, Any]) -> str | Script:
        last = body["messages"][-1]
        content = last["content"] if isinstance(last.get("content"), str) else ""
        if last["role"] == "system" and "in your own words" in content:
            return content.rsplit(": ", 1)[-1]
        offered = {tool.get("function", {}).get("name") for tool in body.get("tools") or []}
        if "delegate" in offered and last["role"] == "user":
            return Script("", [Call("delegate", {"task": task})])
        return reply

    return answer


class FakeOpenAI:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        reply: Reply = "Hello! How can I help you today?",
        transcript: Reply = "What is the weather like?",
        stt_ms: float = 0.0,
        ttft_ms: float = 0.0,
        tokens_per_s: float = 0.0,  # 0: as fast as possible
        llm_failure: str | None = None,
        stt_failure: str | None = None,
        fail_after_tokens: int = 0,
        model: str = "fake-llm",
        usage: bool = True,
        stt_streams: bool = False,
        stt_tokens_per_s: float = 0.0,  # 0: as fast as possible
        responses_api: bool = True,
        reuse_port: bool = False,
    ) -> None:
        """``usage``: report token counts when asked (stream_options.include_usage); some servers never do."""
        for failure in (llm_failure, stt_failure):
            if failure is not None and failure not in FAILURES:
                raise ValueError(f"unknown failure {failure!r}, expected one of {FAILURES}")
        if stt_failure == "garbage":
            raise ValueError("failure 'garbage' is for the chat endpoint only")
        self.host, self.port = host, port
        self.reply, self.transcript = reply, transcript
        self.stt_ms, self.ttft_ms, self.tokens_per_s = stt_ms, ttft_ms, tokens_per_s
        self.llm_failure, self.stt_failure = llm_failure, stt_failure
        self.fail_after_tokens = fail_after_tokens
        self.model = model
        self.usage = usage
        self.stt_streams, self.stt_tokens_per_s = stt_streams, stt_tokens_per_s
        self.responses_api = responses_api
        self.reuse_port = reuse_port
        self.requests: list[Recorded] = []
        # ("stt" or "llm", seconds from a request's arrival to the first bytes of its answer's content)
        self.latencies: list[tuple[str, float]] = []
        self.in_flight = self.in_flight_max = 0
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def responses_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/responses")]

    @property
    def stt_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/audio/transcriptions")]

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)
        if self.responses_api:
            app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        # Cancelling the handler when the client disconnects is how a closed stream is noticed
        # even while the handler sleeps (time to first token, hang).
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_port=self.reuse_port or None)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAI:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _text(self, reply: Reply, body: dict[str, Any]) -> str:
        text = reply(body) if callable(reply) else reply
        assert isinstance(text, str)
        return text

    def _script(self, body: dict[str, Any]) -> Script:
        reply = self.reply(body) if callable(self.reply) else self.reply
        return reply if isinstance(reply, Script) else Script(reply)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        # Latencies count from the request's arrival, as a real server's do: reading and parsing the
        # body is part of them, so under load the fake's own CPU does not add to what a client measures.
        arrived = asyncio.get_running_loop().time()
        first_token_at = arrived + self.ttft_ms / 1000
        with self._held():
            body = orjson.loads(await request.read())
            rec = Recorded(request.path, body)
            self.requests.append(rec)
            try:
                return await self._chat_reply(request, body, rec, first_token_at, arrived)
            except (asyncio.CancelledError, ConnectionResetError):
                rec.closed_by_client = not rec.dropped
                raise
            finally:
                rec.done.set()

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        """Counts the requests being answered at once."""
        self.in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1

    def _answered(self, endpoint: str, arrived: float) -> None:
        self.latencies.append((endpoint, asyncio.get_running_loop().time() - arrived))

    async def _chat_reply(
        self, request: web.Request, body: dict[str, Any], rec: Recorded, first_token_at: float, arrived: float
    ) -> web.StreamResponse:
        failure = self.llm_failure
        if failure == "500":
            return _error_500()
        if failure in ("break", "hang") and self.fail_after_tokens == 0:
            await _fail(request, failure, rec)
        script = self._script(body)
        tokens = tokenize(script.text)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        finish_reason = "tool_calls" if script.calls else "stop"
        calls = [(c.id or f"call_{uuid.uuid4().hex[:24]}", c.name,
                  c.arguments if isinstance(c.arguments, str) else orjson.dumps(c.arguments).decode())
                 for c in script.calls]
        if limit is not None and len(tokens) > limit:
            tokens, finish_reason, calls = tokens[:limit], "length", []
        created = int(time.time())
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        await _sleep_until(first_token_at)
        if not body.get("stream"):
            rec.tokens_sent = len(tokens)
            rec.finished = True
            self._answered("llm", arrived)
            return web.json_response(
                {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": created,
                    "model": self.model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "".join(tokens) or None, "refusal": None,
                                        "tool_calls": [{"id": i, "type": "function",
                                                        "function": {"name": n, "arguments": a}}
                                                       for i, n, a in calls] or None},
                            "logprobs": None,
                            "finish_reason": finish_reason,
                        }
                    ],
                    "usage": _usage(body, len(tokens)),
                }
            )

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "system_fingerprint": None,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            return _sse(data)

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(chunk({"role": "assistant", "content": "", "refusal": None}))
        interval = 1 / self.tokens_per_s if self.tokens_per_s > 0 else 0.0
        for n, token in enumerate(tokens):
            if failure in ("break", "hang") and n == self.fail_after_tokens:
                await _fail(request, failure, rec)
            if failure == "garbage" and n == self.fail_after_tokens:
                await response.write(b'data: ["not", "a", "chunk"]\n\n')
            if n and interval:
                await asyncio.sleep(interval)
            await response.write(chunk({"content": token}))
            if n == 0:
                self._answered("llm", arrived)
            rec.tokens_sent += 1
        for index, (call_id, name, arguments) in enumerate(calls):
            start = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
            await response.write(chunk({"tool_calls": [start]}))
            for piece in _pieces(arguments):
                if interval:
                    await asyncio.sleep(interval)
                await response.write(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
                rec.tokens_sent += 1
        await response.write(chunk({}, finish_reason))
        if self.usage and (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "choices": [],
                "usage": _usage(body, len(tokens)),
            }
            await response.write(_sse(usage))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        rec.finished = True
        return response

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/responses, streamed: the reply's message and function calls as Responses events."""
        body = orjson.loads(await request.read())
        rec = Recorded(request.path, body)
        self.requests.append(rec)
        try:
            script = self._script(body)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            seq = iter(range(1_000_000))
            snapshot: dict[str, Any] = {"id": f"resp_{uuid.uuid4().hex[:24]}", "object": "response",
                                        "created_at": int(time.time()), "status": "in_progress", "model": self.model,
                                        "output": [], "instructions": body.get("instructions"),
                                        "tools": body.get("tools", []), "usage": None}

            async def send(kind: str, **fields: Any) -> None:
                data = {"type": kind, "sequence_number": next(seq), **fields}
                await response.write(f"event: {kind}\n".encode() + _sse(data))

            await send("response.created", response=dict(snapshot))
            await send("response.in_progress", response=dict(snapshot))
            output: list[dict[str, Any]] = []
            tokens = tokenize(script.text)
            if tokens:
                item_id = f"msg_{uuid.uuid4().hex[:24]}"
                item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
                await send("response.output_item.added", output_index=0, item=item)
                place = {"item_id": item_id, "output_index": 0, "content_index": 0}
                await send("response.content_part.added", **place, part={"type": "output_text", "text": "",
                                                                         "annotations": []})
                for token in tokens:
                    await send("response.output_text.delta", **place, delta=token, logprobs=[])
                    rec.tokens_sent += 1
                part = {"type": "output_text", "text": script.text, "annotations": []}
                await send("response.output_text.done", **place, text=script.text, logprobs=[])
                await send("response.content_part.done", **place, part=part)
                item = {**item, "status": "completed", "content": [part]}
                await send("response.output_item.done", output_index=0, item=item)
                output.append(item)
            for call in script.calls:
                index = len(output)
                arguments = call.arguments if isinstance(call.arguments, str) else orjson.dumps(call.arguments).decode()
                item = {"id": f"fc_{uuid.uuid4().hex[:24]}", "type": "function_call", "status": "in_progress",
                        "call_id": f"call_{uuid.uuid4().hex[:24]}", "name": call.name, "arguments": ""}
                await send("response.output_item.added", output_index=index, item=item)
                for piece in _pieces(arguments):
                    await send("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                               delta=piece)
                await send("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                           arguments=arguments)
                item = {**item, "status": "completed", "arguments": arguments}
                await send("response.output_item.done", output_index=index, item=item)
                output.append(item)
            input_tokens = len(orjson.dumps(body.get("input", []))) // 4
            usage = {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                     "output_tokens": len(tokens), "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": input_tokens + len(tokens)}
            await send("response.completed", response={**snapshot, "status": "completed", "output": output,
                                                       "usage": usage})
            await response.write_eof()
            rec.finished = True
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            rec.closed_by_client = True
            raise
        finally:
            rec.done.set()

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": "fake", "object": "model", "created": 0, "owned_by": "fake"}
        return web.json_response({"object": "list", "data": [model]})

    async def _transcribe(self, request: web.Request) -> web.StreamResponse:
        arrived = asyncio.get_running_loop().time()
        with self._held():
            return await self._transcription(request, arrived)

    async def _transcription(self, request: web.Request, arrived: float) -> web.StreamResponse:
        done_at = arrived + self.stt_ms / 1000  # see _chat
        form = await request.post()
        fields: dict[str, Any] = {}
        for name, value in form.items():
            if isinstance(value, web.FileField):
                with value.file, wave.open(io.BytesIO(value.file.read())) as wav:
                    fields[name] = {
                        "filename": value.filename,
                        "rate": wav.getframerate(),
                        "channels": wav.getnchannels(),
                        "pcm": wav.readframes(wav.getnframes()),
                    }
            else:
                fields[name] = value
        rec = Recorded(request.path, fields)
        self.requests.append(rec)
        try:
            if self.stt_failure == "500":
                return _error_500()
            streamed = self.stt_streams and fields.get("stream") == "true"
            if self.stt_failure in ("break", "hang") and not (streamed and self.fail_after_tokens):
                await _fail(request, self.stt_failure, rec)
            await _sleep_until(done_at)
            text = self._text(self.transcript, fields)
            self._answered("stt", arrived)
            if streamed:
                return await self._stream_transcript(request, text, rec)
            rec.finished = True
            if fields.get("response_format") == "text":
                return web.Response(text=text)
            return web.json_response({"text": text})
        except (asyncio.CancelledError, ConnectionResetError):
            rec.closed_by_client = not rec.dropped
            raise
        finally:
            rec.done.set()

    async def _stream_transcript(self, request: web.Request, text: str, rec: Recorded) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        tokens = tokenize(text)
        interval = 1 / self.stt_tokens_per_s if self.stt_tokens_per_s > 0 else 0.0
        for n, token in enumerate(tokens):
            if self.stt_failure in ("break", "hang") and n == self.fail_after_tokens:
                await _fail(request, self.stt_failure, rec)
            if n and interval:
                await asyncio.sleep(interval)
            await response.write(_sse({"type": "transcript.text.delta", "delta": token, "logprobs": None}))
            rec.tokens_sent += 1
        audio_tokens = len(rec.body["file"]["pcm"]) // 4800  # about 10 per second, as gpt-4o-transcribe counts
        usage = {"type": "tokens", "input_tokens": audio_tokens, "output_tokens": len(tokens),
                 "total_tokens": audio_tokens + len(tokens),
                 "input_token_details": {"text_tokens": 0, "audio_tokens": audio_tokens}}
        await response.write(_sse({"type": "transcript.text.done", "text": text, "logprobs": None, "usage": usage}))
        await response.write_eof()
        rec.finished = True
        return response


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def _sleep_until(when: float) -> None:
    await asyncio.sleep(max(0.0, when - asyncio.get_running_loop().time()))


def _pieces(arguments: str, size: int = 8) -> list[str]:
    """A call's arguments in the pieces a server streams them in."""
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def _usage(body: dict[str, Any], completion_tokens: int) -> dict[str, int]:
    prompt_tokens = len(orjson.dumps(body.get("messages", []))) // 4
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _error_500() -> web.Response:
    error = {"message": "The server had an error while processing your request.", "type": "server_error"}
    return web.json_response({"error": {**error, "param": None, "code": None}}, status=500)


async def _fail(request: web.Request, failure: str, rec: Recorded) -> None:
    if failure == "break":
        assert request.transport is not None
        rec.dropped = True
        request.transport.close()
        raise asyncio.CancelledError  # ends the handler quietly: there is no one to answer
    await asyncio.Event().wait()  # hang until the client goes away (the handler is then cancelled)


async def _serve(args: argparse.Namespace) -> None:
    reply = args.reply
    if args.reply_file:
        with open(args.reply_file, encoding="utf-8") as f:
            reply = f.read()
    fake = FakeOpenAI(
        host=args.host,
        port=args.port,
        reply=delegating(reply) if args.delegate else reply,
        transcript=args.transcript,
        stt_ms=args.stt_ms,
        ttft_ms=args.ttft_ms,
        tokens_per_s=args.tokens_per_s,
        llm_failure=args.llm_failure,
        stt_failure=args.stt_failure,
        fail_after_tokens=args.fail_after_tokens,
        stt_streams=args.stt_streams,
        reuse_port=args.reuse_port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await fake.start()
    reporting = asyncio.create_task(_report(fake, args.stats)) if args.stats else None
    print(f"listening on {fake.base_url}", flush=True)
    await stop.wait()
    if reporting is not None:
        reporting.cancel()
    await fake.stop()


async def _report(fake: FakeOpenAI, path: str) -> None:
    """Once a second, what this process saw over that second (the module's docstring), as one JSON line."""
    lags: list[float] = []
    probe = asyncio.create_task(lag_probe(lambda lag: lags.append(round(lag * 1000, 3))))
    try:
        with open(path, "a", buffering=1) as out:
            while True:
                await asyncio.sleep(1.0)
                seen, fake.latencies = fake.latencies, []
                out.write(json.dumps({
                    "t": time.time(), "pid": os.getpid(), "lags_ms": lags,
                    "stt_ms": [round(s * 1000, 2) for kind, s in seen if kind == "stt"],
                    "llm_ms": [round(s * 1000, 2) for kind, s in seen if kind == "llm"],
                    "in_flight_max": fake.in_flight_max}) + "\n")
                lags, fake.in_flight_max = [], fake.in_flight
    finally:
        probe.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port (printed)")
    parser.add_argument("--reply", default="Hello! How can I help you today?")
    parser.add_argument("--reply-file", help="read the reply text from this file")
    parser.add_argument("--delegate", action="store_true", help="answer as a GPT-Live voice model that delegates "
                        "each user turn and speaks the notes it is told to (see delegating)")
    parser.add_argument("--transcript", default="What is the weather like?")
    parser.add_argument("--stt-ms", type=float, default=0.0, help="transcription latency")
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="time to first token")
    parser.add_argument("--tokens-per-s", type=float, default=0.0, help="token rate, 0 = unlimited")
    parser.add_argument("--llm-failure", choices=FAILURES)
    parser.add_argument("--stt-failure", choices=[f for f in FAILURES if f != "garbage"])
    parser.add_argument("--stt-streams", action="store_true", help="stream transcriptions asked with stream=true")
    parser.add_argument("--fail-after-tokens", type=int, default=0)
    parser.add_argument("--reuse-port", action="store_true", help="share the port with other processes (SO_REUSEPORT)")
    parser.add_argument("--stats", help="append what this process saw to this file once a second (JSON lines)")
    parser.add_argument("--cpus", default="", help="run on these cores only (e.g. 12-15)")
    args = parser.parse_args()
    pin(args.cpus)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
