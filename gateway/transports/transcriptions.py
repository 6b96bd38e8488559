"""POST /v1/audio/transcriptions: an audio file to text, in OpenAI's request and response shapes.

The request is OpenAI's multipart form: ``file`` (mp3, wav, ogg, aac, flac, webm or mp4) and ``model`` (any
name: the gateway has one speech-to-text, the sessions' own), with ``language``, ``prompt``, ``temperature``
(taken, not used), ``chunking_strategy`` (the speech-to-text chunks long audio itself), ``include`` (the
answer has no log probabilities: Pipecat asks for them by default), ``response_format`` and ``stream``.
The answer is ``json`` (``text`` and ``usage``, the audio's duration), ``text``, or ``verbose_json`` with
one segment, the whole file (the speech-to-text gives no timestamps: word timestamps,
``srt`` and ``vtt`` are a 400). With ``stream`` it is server-sent ``transcript.text.delta`` events, one per
piece the speech-to-text gave, then ``transcript.text.done``, sent once the transcription has ended: a
failure is then still an HTTP error, and the request's place is free once its answer goes. What else
OpenAI's models do (diarization, keywords) is a 400 naming the field.

Bounds ([transcriptions]): the file's bytes and its audio's seconds, and ``max_running`` transcriptions at
once in this process, beyond which a request gets 503 with Retry-After at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gateway.audio import SAMPLE_RATE, float32_to_int16
from gateway.audio_codecs import AudioFileError, NoCodecs, decode_upload
from gateway.core.responder import BackendError
from gateway.runtime.gateway import Gateway
from gateway.transports.rest import HttpError, authorize, read_form, string_field, upload_field

FORMATS = ("json", "text", "verbose_json")
TAKEN = frozenset({"file", "model", "language", "prompt", "temperature", "chunking_strategy", "response_format",
                   "stream", "timestamp_granularities", "include"})


class TranscriptionEndpoint:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config.transcriptions
        self.running = 0

    async def create(self, request: Request) -> Response:
        authorize(request, self.gateway)
        fields = await read_form(request, self.config.max_file_bytes, "[transcriptions] max_file_bytes", "file")
        upload = upload_field(fields, "file")
        string_field(fields, "model", required=True)
        if unknown := sorted(fields.keys() - TAKEN):
            raise HttpError(400, f"'{unknown[0]}' is not supported by this gateway's speech-to-text.",
                            "unsupported_parameter", unknown[0])
        language, prompt = string_field(fields, "language"), string_field(fields, "prompt")
        response_format = string_field(fields, "response_format") or "json"
        if response_format not in FORMATS:
            raise HttpError(400, f"'response_format' must be one of {', '.join(FORMATS)} (the speech-to-text gives no "
                                 f"timestamps for subtitles); got {response_format!r}.", "invalid_value",
                            "response_format")
        granularities = fields.get("timestamp_granularities") or []
        if "word" in granularities:
            raise HttpError(400, "Word timestamps are not supported: the speech-to-text gives no timestamps.",
                            "unsupported_value", "timestamp_granularities")
        stream = (string_field(fields, "stream") or "false").lower() == "true"
        transcriber = self.gateway.transcriber
        if transcriber is None:
            raise HttpError(501, "This gateway has no speech-to-text ([stt] base_url, or the local whisper).",
                            "stt_unavailable", kind="server_error", headers={"x-should-retry": "false"})
        if self.running >= self.config.max_running:
            raise HttpError(503, f"{self.running} transcriptions are running, as many as this gateway runs at once "
                                 "([transcriptions] max_running); retry shortly.", "server_busy", kind="server_error",
                            headers={"Retry-After": str(self.config.retry_after_s)})
        self.running += 1
        try:
            pcm = await self._decode(upload.data)
            pieces = [piece async for piece in transcriber.transcribe(pcm, language, prompt) if piece]
        except BackendError as exc:
            raise HttpError(502, f"The speech-to-text failed: {exc}.", "stt_failed", kind="server_error") from None
        finally:
            self.running -= 1
        text = "".join(pieces).strip()
        usage = {"type": "duration", "seconds": round(len(pcm) / 2 / SAMPLE_RATE, 3)}
        if stream:
            events = [{"type": "transcript.text.delta", "delta": piece} for piece in pieces]
            events.append({"type": "transcript.text.done", "text": text, "usage": usage})
            return Response(b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events),
                            media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        if response_format == "text":
            return PlainTextResponse(text + "\n")
        body: dict[str, Any] = {"text": text, "usage": usage}
        if response_format == "verbose_json":
            heard = getattr(transcriber, "languages", None)  # the local whisper's: {"en"} for tiny.en
            only = min(heard) if heard and len(heard) == 1 else "unknown"
            seconds = usage["seconds"]
            body = {"task": "transcribe", "language": language or only, "duration": seconds, "text": text,
                    "segments": [_segment(text, seconds)] if text else [], "usage": usage}
        return Response(orjson.dumps(body), media_type="application/json")

    async def _decode(self, data: bytes) -> bytes:
        """The file's audio as pcm16 24 kHz, decoded off the event loop."""
        try:
            audio = await asyncio.to_thread(decode_upload, data, self.config.max_seconds)
        except NoCodecs as exc:
            raise HttpError(501, f"'file': {exc}.", "codecs_unavailable", "file", kind="server_error",
                            headers={"x-should-retry": "false"}) from None
        except AudioFileError as exc:
            hint = " ([transcriptions] max_seconds)" if exc.kind == "too_long" else ""
            code = {"unsupported": "unsupported_audio", "too_long": "audio_too_long"}.get(exc.kind, "invalid_audio")
            raise HttpError(400, f"'file': {exc}{hint}.", code, "file") from None
        return float32_to_int16(np.clip(audio, -1.0, 1.0)).tobytes()


def _segment(text: str, seconds: float) -> dict[str, Any]:
    return {"id": 0, "seek": 0, "start": 0.0, "end": seconds, "text": text, "tokens": [], "temperature": 0.0,
            "avg_logprob": 0.0, "compression_ratio": 1.0, "no_speech_prob": 0.0}


def transcription_routes(gateway: Gateway) -> list[Route]:
    endpoint = TranscriptionEndpoint(gateway)
    return [Route("/v1/audio/transcriptions", endpoint.create, methods=["POST"])]
