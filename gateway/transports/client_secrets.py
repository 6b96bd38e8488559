"""Minting ephemeral client secrets, in the shapes of the ``openai`` SDK's types.

  POST /v1/realtime/client_secrets           GA: {expires_after, session} → {value, expires_at, session}
  POST /v1/realtime/sessions                 beta: session fields → the session + client_secret
  POST /v1/realtime/transcription_sessions   beta: transcription fields → the session + client_secret

Each needs a real API key (a secret cannot mint secrets). A configuration is checked by a throw-away
session of its type before it is signed (a secret that could open no session is never handed out), and the
answer shows the session it will open.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.core.effects import SendEvent
from gateway.realtime.events import Dialect
from gateway.realtime.session import Session
from gateway.runtime.auth import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S, SecretTooLarge
from gateway.runtime.gateway import Gateway, SessionRefused, configure
from gateway.transports.rest import HttpError, authorize, read_json_object

MAX_REQUEST_BYTES = 64 * 1024


def _ttl(expires_after: Any, param: str) -> int:
    if expires_after is None:
        return DEFAULT_TTL_S
    if not isinstance(expires_after, dict):
        raise HttpError(400, f"'{param}' must be an object.", "invalid_type", param)
    if expires_after.get("anchor", "created_at") != "created_at":
        raise HttpError(400, "Only the anchor 'created_at' is supported.", "invalid_value", param + ".anchor")
    seconds = expires_after.get("seconds", DEFAULT_TTL_S)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise HttpError(400, f"'seconds' must be an integer from {MIN_TTL_S} to {MAX_TTL_S}.", "invalid_value",
                        param + ".seconds")
    return seconds


def _object(value: Any, param: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise HttpError(400, f"'{param}' must be an object.", "invalid_type", param)
    return value


class ClientSecrets:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def _mint(self, session: dict[str, Any], dialect: Dialect, kind: str, ttl: int) -> tuple[str, int]:
        try:
            return self.gateway.auth.mint(session, dialect, kind, ttl)
        except SecretTooLarge as exc:
            raise HttpError(400, str(exc), "session_too_large", "session") from None

    def _session(self, config: dict[str, Any], dialect: Dialect, kind: str = "realtime") -> dict[str, Any]:
        """The session a configuration opens, as its created event will show it."""
        session = Session(self.gateway.config, dialect, session_type=kind)
        try:
            configure(session, config, kind)
        except SessionRefused as exc:
            raise HttpError(400, str(exc), "invalid_session", "session") from None
        created = session.open()[0]
        assert isinstance(created, SendEvent)
        return created.event["session"]

    async def create_ga(self, request: Request) -> Response:
        authorize(request, self.gateway)
        body = await read_json_object(request, MAX_REQUEST_BYTES)
        ttl = _ttl(body.get("expires_after"), "expires_after")
        config = _object(body.get("session"), "session")
        kind = config.get("type", "realtime")
        if kind not in ("realtime", "transcription"):
            raise HttpError(400, "'session.type' must be 'realtime' or 'transcription'.", "invalid_value",
                            "session.type")
        shown = self._session(config, Dialect.GA, kind)
        value, expires_at = self._mint(config, Dialect.GA, kind, ttl)
        return JSONResponse({"value": value, "expires_at": expires_at, "session": {**shown, "expires_at": expires_at}})

    async def create_beta_session(self, request: Request) -> Response:
        authorize(request, self.gateway)
        body = await read_json_object(request, MAX_REQUEST_BYTES)
        ttl = _ttl(_object(body.get("client_secret"), "client_secret").get("expires_after"),
                   "client_secret.expires_after")
        config = {k: v for k, v in body.items() if k != "client_secret"}
        shown = self._session(config, Dialect.BETA)
        value, expires_at = self._mint(config, Dialect.BETA, "realtime", ttl)
        return JSONResponse({**shown, "expires_at": expires_at,
                             "client_secret": {"value": value, "expires_at": expires_at}})

    async def create_beta_transcription(self, request: Request) -> Response:
        authorize(request, self.gateway)
        body = await read_json_object(request, MAX_REQUEST_BYTES)
        # The SDK's beta transcription type names it expires_at, its realtime one expires_after.
        secret = _object(body.get("client_secret"), "client_secret")
        ttl = _ttl(secret.get("expires_at", secret.get("expires_after")), "client_secret.expires_at")
        config = {k: v for k, v in body.items() if k != "client_secret"}
        shown = self._session(config, Dialect.BETA, "transcription")
        value, expires_at = self._mint(config, Dialect.BETA, "transcription", ttl)
        return JSONResponse({**shown, "client_secret": {"value": value, "expires_at": expires_at}})


def client_secret_routes(gateway: Gateway) -> list[Route]:
    secrets = ClientSecrets(gateway)
    return [
        Route("/v1/realtime/client_secrets", secrets.create_ga, methods=["POST"]),
        Route("/v1/realtime/sessions", secrets.create_beta_session, methods=["POST"]),
        Route("/v1/realtime/transcription_sessions", secrets.create_beta_transcription, methods=["POST"]),
    ]
