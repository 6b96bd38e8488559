"""POST /v1/audio/speech: text to speech in OpenAI's request and response shapes, streamed as it is made.

The request is OpenAI's (``model``, ``input``, ``voice``: a name or ``{"id": ...}``, ``instructions``,
``response_format``, ``speed``, ``stream_format``) plus the engine's own fields, which OpenAI's SDKs send
through ``extra_body``: ``language`` and the sampling (engine.api.Sampling: ``seed``, ``temperature``,
``top_k``, ``top_p``, ``repetition_penalty`` and the code predictor's ``subtalker_*``). Anything else, or
a value out of range, is a 400 naming the field.

The answer starts once the engine's first audio exists (so an input the engine refuses, or one that gives
no audio at all, is still a 400, not a broken stream or an empty file), then goes out as the engine makes
it: the encoded audio as chunked bytes (``stream_format`` "audio"), or server-sent events
``speech.audio.delta`` (base64 of the same bytes) and ``speech.audio.done`` with the usage (``sse``). A
client that goes away stops its engine stream at once.
Usage counts the input's characters as input tokens and the audio's 80 ms frames (the 12 Hz codec's) as
output tokens. A request beyond the gateway's share of the engine gets 503 with Retry-After
(gateway.runtime.speech).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from engine.api import Sampling, TTSChunk, TTSEngine, TTSError, TTSStream
from engine.voices import VoicePrompt
from gateway.audio import SAMPLE_RATE
from gateway.audio_codecs import MAX_SPEED, MIN_SPEED, RESPONSE_FORMATS, NoCodecs, SpeechEncoder
from gateway.core.responder import BackendError
from gateway.responders.text_bridge import TextBridge
from gateway.runtime.gateway import Gateway
from gateway.runtime.speech import SpeechBusy, SpeechService
from gateway.runtime.voices.library import VoiceRefused
from gateway.transports.rest import HttpError, authorize, read_json_object, string_field

log = logging.getLogger(__name__)

OPENAI_FIELDS = frozenset({"model", "input", "voice", "instructions", "response_format", "speed", "stream_format"})
SAMPLING_FIELDS = frozenset(f.name for f in fields(Sampling))
EXTRA_FIELDS = frozenset({"language"}) | SAMPLING_FIELDS
FRAME_SAMPLES = SAMPLE_RATE * 80 // 1000  # one 12 Hz codec frame: what usage counts as an output token


@dataclass
class SpeechRequest:
    model: str
    text: str
    voice: str  # an engine voice name, or a custom voice's id
    custom: bool  # voice given as {"id": ...}
    instructions: str | None
    response_format: str
    speed: float
    sse: bool
    language: str | None
    sampling: Sampling | None


def _choice(body: dict[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
    value = string_field(body, name)
    value = default if value is None else value
    if value not in choices:
        raise HttpError(400, f"'{name}' must be one of {', '.join(choices)}; got {value!r}.", "invalid_value", name)
    return value


def parse_request(body: dict[str, Any], gateway: Gateway) -> SpeechRequest:
    """The request, each field checked; HttpError 400 naming the first that is wrong."""
    config = gateway.config.speech
    unknown = sorted(set(body) - OPENAI_FIELDS - EXTRA_FIELDS)
    if unknown:
        raise HttpError(400, f"Unrecognized request argument supplied: {unknown[0]}.", "unknown_parameter", unknown[0])
    model = string_field(body, "model", required=True)
    text = string_field(body, "input", required=True, limit=config.max_input_chars)
    assert model is not None and text is not None
    if not model.strip():  # any name is this gateway's engine (a router's "openai/tts-1" too), but not none
        raise HttpError(400, "'model' is empty: name a speech model (tts-1, gpt-4o-mini-tts, ...).", "invalid_value",
                        "model")
    if not text.strip():
        raise HttpError(400, "'input' is empty: give the text to speak.", "empty_input", "input")
    voice = body.get("voice")
    custom = isinstance(voice, dict)
    if custom:
        extra = sorted(set(voice) - {"id"})
        if extra:
            raise HttpError(400, f"Unknown field 'voice.{extra[0]}'.", "unknown_parameter", f"voice.{extra[0]}")
        voice = string_field(voice, "id", required=True, param="voice.id")
        if voice is not None and not voice.strip():
            raise HttpError(400, "'voice.id' is empty.", "invalid_value", "voice.id")
    elif voice is None:
        raise HttpError(400, "Missing required parameter: 'voice'.", "missing_required_parameter", "voice")
    elif not isinstance(voice, str) or not voice.strip():
        raise HttpError(400, "'voice' must be a voice name or an object {\"id\": ...}.", "invalid_type", "voice")
    speed = body.get("speed", 1.0)
    if speed is None:
        speed = 1.0
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise HttpError(400, f"'speed' must be a number from {MIN_SPEED} to {MAX_SPEED}; got {speed!r}.",
                        "invalid_value", "speed")
    sampling = None
    given = {name: body[name] for name in SAMPLING_FIELDS if body.get(name) is not None}
    if given:
        sampling = Sampling(**given)
        if (problem := sampling.problem()) is not None:
            raise HttpError(400, problem[1] + ".", "invalid_value", problem[0])
    language = string_field(body, "language", limit=64)
    return SpeechRequest(
        model=model, text=text, voice=voice, custom=custom,
        instructions=string_field(body, "instructions", limit=config.max_instructions_chars) or None,
        response_format=_choice(body, "response_format", tuple(RESPONSE_FORMATS), "mp3"),
        speed=float(speed), sse=_choice(body, "stream_format", ("audio", "sse"), "audio") == "sse",
        language=language.strip() or None if language is not None else None, sampling=sampling)


def _input_error(exc: TTSError, req: SpeechRequest) -> HttpError:
    """The engine's refusal of the request's input, naming the field it is about."""
    message = str(exc)
    param = "input"
    if "language" in message:
        param = "language"
    elif "voice" in message or "speaker" in message:
        param = "voice.id" if req.custom else "voice"
    return HttpError(400, message[:1].upper() + message[1:] + ".", "invalid_value", param)


def _backend_error(exc: BackendError) -> HttpError:
    return HttpError(503, f"The speech engine failed: {exc.cause}.", "engine_unavailable", kind="server_error",
                     headers={"Retry-After": "1"})


class SpeechEndpoint:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.service: SpeechService = gateway.speech

    async def create(self, request: Request) -> Response:
        received = time.perf_counter()
        authorize(request, self.gateway)
        speech = self.gateway.config.speech
        # The input and instructions at 4 bytes a character at most, plus the other fields.
        body = await read_json_object(request, 4 * (speech.max_input_chars + speech.max_instructions_chars) + 65536)
        req = parse_request(body, self.gateway)
        try:
            encoder = SpeechEncoder(req.response_format, req.speed)
        except NoCodecs as exc:
            raise HttpError(501, str(exc)[:1].upper() + str(exc)[1:] + ".", "format_unavailable", "response_format",
                            kind="server_error", headers={"x-should-retry": "false"}) from None
        if not self.gateway.ready:
            raise HttpError(503, "The gateway is starting.", "server_starting", kind="server_error",
                            headers={"Retry-After": "5"})
        engine = await self.service.engine()
        prompt = await self._prompt(req, engine)
        watch = _Watch(request.receive)  # the body is read: from here on, a client that leaves stops the request
        stream = chunks = admitted = None
        try:
            await self.service.acquire()
            admitted = time.perf_counter()
            stream = self._open(engine, req, prompt)
            chunks = aiter(stream)
            first = await anext(chunks, None)
            while first is not None and not first.pcm:
                first = await anext(chunks, None)
            if first is None:  # emoji or punctuation alone: a 200 would carry an empty, undecodable file
                raise TTSError("the input gives no speech: it has no words to say")
        except BaseException as exc:
            watch.stop()
            await _stop(stream, chunks)
            if admitted is not None:
                self.service.release()
            if isinstance(exc, asyncio.CancelledError) and watch.caused(exc):
                return Response(status_code=499)
            if isinstance(exc, SpeechBusy):
                raise HttpError(503, str(exc), "speech_capacity_reached", kind="server_error",
                                headers={"Retry-After": str(exc.retry_after_s)}) from None
            if isinstance(exc, TTSError):
                raise _input_error(exc, req) from None
            if isinstance(exc, BackendError):
                raise _backend_error(exc) from None
            raise
        # When the request waited for a place and when the engine's first audio came, from its arrival (the
        # standard Server-Timing header): what the HTTP path adds is a client's first byte less "audio".
        audio_ms = (time.perf_counter() - received) * 1000
        timing = f"queue;dur={(admitted - received) * 1000:.1f}, audio;dur={audio_ms:.1f}"
        media_type = "text/event-stream" if req.sse else encoder.content_type

        async def close() -> None:
            await _stop(stream, chunks)  # a client gone mid-stream frees the engine stream at once
            self.service.release()

        return _SpeechStream(self._respond(req, encoder, first, chunks), watch, close, media_type,
                             {"Cache-Control": "no-cache", "Server-Timing": timing})

    async def _prompt(self, req: SpeechRequest, engine: TTSEngine) -> VoicePrompt | None:
        """The voice's prompt: a voice prepared at start ([voices.NAME]) or a custom voice of the deployment
        (by id); None for one of the engine's own voices. HttpError 400 for a voice there is none of."""
        param = "voice.id" if req.custom else "voice"
        prepared = getattr(self.gateway.responder, "prepared", {}).get(req.voice.lower())
        if prepared is not None:
            return prepared
        try:
            prompt = await self.gateway.voices.prompt_for(req.voice, engine)
        except VoiceRefused as exc:
            raise HttpError(400 if exc.kind == "invalid" else 501, str(exc), exc.code, param) from None
        if prompt is not None:
            return prompt
        if req.custom or (engine.voices is not None and req.voice.lower() not in engine.voices):
            names = sorted(engine.voices or ()) + sorted(getattr(self.gateway.responder, "prepared", {}))
            raise HttpError(400, f"No voice {req.voice!r}: this gateway has {', '.join(names) or 'any name'} and the "
                                 "custom voices of /v1/audio/voices.", "voice_not_found", param)
        return None

    def _open(self, engine: TTSEngine, req: SpeechRequest, prompt: VoicePrompt | None) -> TTSStream:
        stream = engine.open(req.voice, req.language, prompt=prompt, instructions=req.instructions,
                             sampling=req.sampling)
        try:
            if engine.incremental:
                stream.feed(req.text)
            else:
                tts = self.gateway.config.tts
                bridge = TextBridge(tts.starter_chars, tts.max_segment_chars)
                for segment in bridge.feed(req.text) + bridge.end():
                    if segment.strip():
                        stream.feed(segment.strip())
            stream.end()
        except BaseException:
            stream.cancel()
            raise
        return stream

    async def _respond(self, req: SpeechRequest, encoder: SpeechEncoder, first: TTSChunk | None,
                       chunks: AsyncIterator[TTSChunk]) -> AsyncGenerator[bytes]:
        loop = asyncio.get_running_loop()
        pool = self.service.codec_pool

        async def encode(pcm: bytes) -> bytes:
            if encoder.passthrough:  # pcm as it is: nothing to run off the loop
                return encoder.encode(pcm)
            return await loop.run_in_executor(pool, encoder.encode, pcm)

        def frame(data: bytes) -> bytes:
            if not req.sse:
                return data
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            return b"data: " + orjson.dumps(event) + b"\n\n"

        try:
            chunk = first
            while chunk is not None:
                if chunk.pcm and (data := await encode(chunk.pcm)):
                    yield frame(data)
                chunk = await anext(chunks, None)
            tail = encoder.finish() if encoder.passthrough else await loop.run_in_executor(pool, encoder.finish)
            if tail:
                yield frame(tail)
            if req.sse:
                usage = {"input_tokens": len(req.text), "output_tokens": math.ceil(encoder.samples_in / FRAME_SAMPLES)}
                usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
                yield b"data: " + orjson.dumps({"type": "speech.audio.done", "usage": usage}) + b"\n\n"
        except (TTSError, BackendError) as exc:
            # Headers are sent: the response can only stop short, which the client sees as a broken stream.
            log.warning("speech request stopped: %s", exc)
            raise


class _SpeechStream(Response):
    """The streamed answer (an ASGI response, as Starlette's StreamingResponse), on the request's own task:
    its _Watch cancels it when the client leaves, where StreamingResponse starts a task group (anyio's, a
    second task and a listener per request) to learn that. `close` runs once it ends, however it ends."""

    body_iterator: AsyncGenerator[bytes]

    def __init__(self, body: AsyncGenerator[bytes], watch: _Watch, close: Callable[[], Awaitable[None]],
                 media_type: str, headers: dict[str, str]) -> None:
        self.body_iterator, self.watch, self.close = body, watch, close
        self.status_code, self.media_type, self.background = 200, media_type, None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with contextlib.aclosing(self.body_iterator) as body:
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                async for data in body:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
        except asyncio.CancelledError as exc:
            if not self.watch.caused(exc):
                raise
            return  # the client is gone: nothing more to send
        finally:
            self.watch.stop()
            await self.close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _stop(stream: TTSStream | None, chunks: AsyncIterator[TTSChunk] | None) -> None:
    """Cancel the engine stream (its row is free at the engine's next step) and close its iterator."""
    if stream is not None:
        stream.cancel()
    if chunks is not None and (close := getattr(chunks, "aclose", None)) is not None:
        with contextlib.suppress(Exception):
            await close()


class _Watch:
    """Cancels the request's task when its client disconnects, until stopped. The body has been read, so the
    next message of the connection can only be its disconnect: one listener, no task beside the request's."""

    def __init__(self, receive: Receive) -> None:
        self.task = asyncio.current_task()
        self.gone = False
        self._listener = asyncio.ensure_future(receive())
        self._listener.add_done_callback(self._heard)

    def _heard(self, listener: asyncio.Future[Message]) -> None:
        if not listener.cancelled() and self.task is not None:
            self.gone = True
            self.task.cancel()

    def stop(self) -> None:
        self._listener.remove_done_callback(self._heard)
        self._listener.cancel()

    def caused(self, exc: asyncio.CancelledError) -> bool:
        """Whether `exc` is the client's leaving (then the cancellation is taken back), not the server's."""
        return self.gone and self.task is not None and self.task.uncancel() == 0


def speech_routes(gateway: Gateway) -> list[Route]:
    endpoint = SpeechEndpoint(gateway)
    return [Route("/v1/audio/speech", endpoint.create, methods=["POST"])]
