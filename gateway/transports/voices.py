"""Custom voices and their consent recordings over HTTP, in the shapes of the ``openai`` SDK's
``audio.voice_consents`` and ``audio.voices`` (gateway.runtime.voices.library does the work):

  POST   /v1/audio/voice_consents              multipart: name, language (BCP 47), recording
  GET    /v1/audio/voice_consents              a cursor page (after, limit 1-100, default 20)
  GET    /v1/audio/voice_consents/{id}
  POST   /v1/audio/voice_consents/{id}         {"name": ...}: a new label
  DELETE /v1/audio/voice_consents/{id}
  POST   /v1/audio/voices                      multipart or JSON: type "audio_sample" (name, audio_sample,
                                               consent; optional transcript) or "prompt" (name, prompt,
                                               optional script_hint, model)
  GET    /v1/audio/voices                      every voice of the deployment (not in the SDK)
  GET    /v1/audio/voices/{id}                 (not in the SDK)
  DELETE /v1/audio/voices/{id}
  GET    /v1/audio/capabilities                what this gateway's speech offers: its voices (those that
                                               sound different, once each), whether it follows
                                               instructions, clones, designs (what it lacks to); the
                                               consent phrases

Voices belong to the deployment: every route needs an API key (a client secret is refused). An upload
over ``[voices] max_file_bytes`` is a 413 naming its field; audio that is not of the accepted containers a
415; a damaged, cut or too long one a 400; nothing is stored unless every check passes.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.runtime.gateway import Gateway
from gateway.runtime.speech import distinct_voices
from gateway.runtime.voices.consent import CONSENT_PHRASES
from gateway.runtime.voices.library import VoiceLibrary, VoiceRefused, missing_models
from gateway.transports.rest import HttpError, authorize, read_form, string_field, upload_field

STATUS = {"invalid": 400, "full": 400, "unsupported": 415, "too_large": 413, "not_found": 404, "unavailable": 501,
          "busy": 503}


def _refused(exc: VoiceRefused) -> HttpError:
    status = STATUS[exc.kind]
    headers = None
    if status == 501:
        headers = {"x-should-retry": "false"}  # the SDKs retry 5xx answers; this one will not change
    elif status == 503:
        headers = {"Retry-After": "1"}
    return HttpError(status, str(exc), exc.code or exc.kind, exc.param,
                     kind="server_error" if status >= 500 else "invalid_request_error", headers=headers)


class VoiceRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.library: VoiceLibrary = gateway.voices
        self.config = gateway.config.voices

    async def _form(self, request: Request, file_field: str | None) -> dict[str, Any]:
        return await read_form(request, self.config.max_file_bytes, "[voices] max_file_bytes", file_field)

    # --- consents --------------------------------------------------------------------------------

    async def create_consent(self, request: Request) -> Response:
        authorize(request, self.gateway)
        fields = await self._form(request, "recording")
        name = string_field(fields, "name", required=True)
        language = string_field(fields, "language", required=True)
        assert name is not None and language is not None
        recording = upload_field(fields, "recording")
        try:
            made = await self.library.create_consent(name, language, recording, self.gateway.transcriber)
        except VoiceRefused as exc:
            raise _refused(exc) from None
        return JSONResponse(made)

    async def list_consents(self, request: Request) -> Response:
        authorize(request, self.gateway)
        after = request.query_params.get("after")
        try:
            limit = int(request.query_params.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise HttpError(400, "'limit' must be an integer from 1 to 100.", "invalid_value", "limit")
        items = await self.library.consents()
        if after:
            ids = [c["id"] for c in items]
            if after not in ids:
                raise HttpError(400, f"'after': no consent recording with id {after!r}.", "invalid_value", "after")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
        return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                             "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})

    async def consent(self, request: Request) -> Response:
        authorize(request, self.gateway)
        consent_id = request.path_params["consent_id"]
        try:
            if request.method == "GET":
                return JSONResponse(await self.library.consent(consent_id))
            if request.method == "DELETE":
                await self.library.delete("consents", consent_id)
                return JSONResponse({"id": consent_id, "object": "audio.voice_consent", "deleted": True})
            fields = await self._form(request, None)
            name = string_field(fields, "name", required=True)
            assert name is not None
            return JSONResponse(await self.library.rename_consent(consent_id, name))
        except VoiceRefused as exc:
            raise _refused(exc) from None

    # --- voices ----------------------------------------------------------------------------------

    async def create_voice(self, request: Request) -> Response:
        authorize(request, self.gateway)
        fields = await self._form(request, "audio_sample")
        kind = string_field(fields, "type") or "audio_sample"
        name = string_field(fields, "name", required=True)
        assert name is not None
        try:
            if kind == "audio_sample":
                sample = upload_field(fields, "audio_sample")
                consent_id = string_field(fields, "consent", required=True)
                assert consent_id is not None
                transcript = string_field(fields, "transcript")
                engine = await self.gateway.speech.engine()
                made = await self.library.create_clone(name, sample, consent_id, engine, self.gateway.transcriber,
                                                       transcript)
            elif kind == "prompt":
                prompt = string_field(fields, "prompt", required=True)
                assert prompt is not None
                hint = string_field(fields, "script_hint")
                if hint is not None and not hint.strip():
                    raise HttpError(400, "'script_hint' is empty.", "invalid_value", "script_hint")
                if hint is not None and len(hint) > self.config.max_prompt_chars:
                    raise HttpError(400, f"'script_hint' is longer than {self.config.max_prompt_chars} characters.",
                                    "string_above_max_length", "script_hint")
                engine = await self.gateway.speech.engine()
                made = await self.library.create_design(name, prompt, engine, hint,
                                                        string_field(fields, "model"))
            else:
                raise HttpError(400, f"'type' must be 'audio_sample' or 'prompt'; got {kind!r}.", "invalid_value",
                                "type")
        except VoiceRefused as exc:
            raise _refused(exc) from None
        return JSONResponse(made)

    async def list_voices(self, request: Request) -> Response:
        authorize(request, self.gateway)
        voices = await self.library.voices()
        return JSONResponse({"object": "list", "data": voices, "has_more": False})

    async def voice(self, request: Request) -> Response:
        authorize(request, self.gateway)
        voice_id = request.path_params["voice_id"]
        try:
            if request.method == "DELETE":
                await self.library.delete("voices", voice_id)
                return JSONResponse({"id": voice_id, "object": "audio.voice.deleted", "deleted": True})
            return JSONResponse(await self.library.voice(voice_id))
        except VoiceRefused as exc:
            raise _refused(exc) from None

    async def capabilities(self, request: Request) -> Response:
        """What the page offers: the engine's voice names (None: any name) and the voices that sound
        different (``distinct_voices``: the voice menus), whether it follows instructions, clones and designs
        voices and what it lacks to (``missing``), and the consent phrases."""
        authorize(request, self.gateway)
        engine = await self.gateway.speech.engine()
        voices = engine.voices
        prepared = getattr(self.gateway.responder, "prepared", {})
        missing = missing_models(engine, self.gateway.transcriber)
        return JSONResponse({
            "model": getattr(engine, "model_name", type(engine).__name__),
            "voices": sorted(voices) if voices is not None else None,
            "distinct_voices": distinct_voices(engine, self.gateway.config, prepared),
            "instructions": bool(getattr(engine, "follows_instructions", False)),
            "cloning": not missing["cloning"],
            "design": not missing["design"],
            "missing": missing,
            "consent_phrases": CONSENT_PHRASES,
            "limits": {"max_file_bytes": self.config.max_file_bytes,
                       "max_sample_seconds": self.config.max_sample_seconds,
                       "max_input_chars": self.gateway.config.speech.max_input_chars},
        })


def voice_routes(gateway: Gateway) -> list[Route]:
    routes = VoiceRoutes(gateway)
    return [
        Route("/v1/audio/voice_consents", routes.create_consent, methods=["POST"]),
        Route("/v1/audio/voice_consents", routes.list_consents, methods=["GET"]),
        Route("/v1/audio/voice_consents/{consent_id}", routes.consent, methods=["GET", "POST", "DELETE"]),
        Route("/v1/audio/voices", routes.create_voice, methods=["POST"]),
        Route("/v1/audio/voices", routes.list_voices, methods=["GET"]),
        Route("/v1/audio/voices/{voice_id}", routes.voice, methods=["GET", "DELETE"]),
        Route("/v1/audio/capabilities", routes.capabilities, methods=["GET"]),
    ]
