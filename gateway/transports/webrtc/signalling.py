"""WebRTC signalling on the gateway's own port: the HTTP side of gateway/transports/webrtc/calls.py's calls.

  POST   /v1/realtime/calls             offer as application/sdp, or multipart/form-data with parts
                                        ``sdp`` and ``session`` (JSON, applied before session.created)
                                        → 201, answer SDP, Location: /v1/realtime/calls/{call_id}
                                        (under ``[webrtc] advertised_url`` when set: this node's own URL)
  DELETE /v1/realtime/calls/{call_id}   hang up → 204
  POST   /v1/realtime?model=...         beta signalling (application/sdp) → 201; beta-shaped events
  POST   /v1/live/sessions              GPT-Live: JSON {session, transport: {type: "webrtc", sdp}} → 201
                                        {session: {id}, transport: {type: "webrtc", sdp}}; the session starts
                                        here (its configuration refused: 400 with the Live error's code and param)

Each needs an API key or a client secret when keys are configured (``Authorization: Bearer``); a call
opened with a client secret starts from the secret's session configuration, then the offer's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.config import ConfigError
from gateway.core.values import ProtocolError, check_fields
from gateway.realtime.events import Dialect
from gateway.runtime.gateway import Gateway, SessionRefused, configure
from gateway.transports.rest import HttpError, authorize, json_object, read_body
from gateway.transports.webrtc.offers import offer_problem

if TYPE_CHECKING:
    from gateway.transports.webrtc.calls import CallRegistry

log = logging.getLogger(__name__)

# An offer is a few KiB; a form adds the session configuration.
MAX_OFFER_BYTES = 256 * 1024
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
SDP_TYPES = ("application/sdp", "text/plain")


def _text(value: str | UploadFile | None, what: str) -> str | None:
    """A form part as text; browsers send a Blob part as a file (already read: the body is bounded)."""
    if isinstance(value, UploadFile):
        value.file.seek(0)
        data: str | bytes = value.file.read()
    else:
        data = value  # type: ignore[assignment]
    if isinstance(data, bytes):
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise HttpError(400, f"The '{what}' part is not UTF-8 text.", "invalid_encoding") from None
    return data


async def read_offer(request: Request) -> tuple[str, dict[str, Any] | None]:
    """(offer SDP, session configuration or None) from an application/sdp or form body."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type not in FORM_TYPES + SDP_TYPES:
        raise HttpError(415, "Send the SDP offer as application/sdp or multipart/form-data.",
                        "unsupported_content_type")
    body = await read_body(request, MAX_OFFER_BYTES)
    if content_type in SDP_TYPES:
        try:
            return body.decode(), None
        except UnicodeDecodeError:
            raise HttpError(400, "The SDP offer is not UTF-8 text.", "invalid_offer") from None
    try:
        form = await request.form(max_files=4, max_fields=8)
    except Exception as exc:  # python-multipart's parse errors; the body is the client's
        raise HttpError(400, f"The form cannot be read: {exc}", "invalid_form") from None
    sdp, session_text = _text(form.get("sdp"), "sdp"), _text(form.get("session"), "session")
    if sdp is None:
        raise HttpError(400, "The form has no 'sdp' part.", "missing_required_parameter")
    if session_text is None:
        return sdp, None
    return sdp, json_object(session_text, "The 'session' part", "invalid_value")


def open_calls(gateway: Gateway) -> CallRegistry | None:
    """The gateway's WebRTC calls, when [webrtc] enabled and the webrtc extra is installed; handed to the
    gateway, whose drain and stop hang them up."""
    if not gateway.config.webrtc.enabled:
        return None
    try:
        from gateway.transports.webrtc.calls import CallRegistry  # aiortc is an optional extra
    except ImportError:
        log.info("WebRTC off: aiortc is not installed (pip install '.[webrtc]')")
        return None
    calls = CallRegistry(gateway)
    gateway.hold(calls)
    return calls


class Signalling:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.calls = open_calls(gateway)

    async def post_call(self, request: Request) -> Response:
        return await self._create(request, Dialect.GA)

    async def post_beta(self, request: Request) -> Response:
        return await self._create(request, Dialect.BETA)

    async def _create(self, request: Request, dialect: Dialect) -> Response:
        credential = authorize(request, self.gateway, secrets_allowed=True)
        calls = self.calls
        if calls is None:
            raise HttpError(404, "WebRTC is off on this gateway ([webrtc] enabled, and the webrtc extra).",
                            "webrtc_disabled")
        client = request.client.host if request.client else ""  # behind a trusted proxy, its X-Forwarded-For
        if (held := self.gateway.secret_refusal(credential.owner, calls.pending_of(credential.owner))) is not None:
            raise HttpError(429, held, "too_many_sessions", kind="rate_limit_error")
        if (refusal := calls.unavailable(client)) is not None:
            raise HttpError(refusal.status, refusal.message, refusal.code,
                            kind="server_error" if refusal.status >= 500 else "rate_limit_error",
                            headers={"Retry-After": str(refusal.retry_after_s)})
        offer, session_config = await read_offer(request)
        if (problem := offer_problem(offer) or calls.offer_problem(offer)) is not None:
            raise HttpError(400, problem, "invalid_offer")
        try:
            session = self.gateway.new_session(dialect, server_playout=True, secret=credential.secret)
            if session_config is not None:
                configure(session, session_config)
        except SessionRefused as exc:
            raise HttpError(400, str(exc), "invalid_session") from None
        try:
            call, answer = await calls.answer(session, offer, client)
        except ConfigError as exc:  # [webrtc] advertised_host does not resolve: this node's fault, not the offer's
            raise HttpError(503, str(exc), "unavailable", kind="server_error") from None
        except Exception as exc:  # aiortc raises ValueError and others on offers it cannot use
            raise HttpError(400, f"The SDP offer cannot be used: {exc}", "invalid_offer") from None
        call.runner.owner = credential.owner
        log.info("call %s (%s) answered", call.id, dialect.name)
        base = self.gateway.config.webrtc.advertised_url.rstrip("/")
        return Response(answer, 201, media_type="application/sdp",
                        headers={"Location": f"{base}/v1/realtime/calls/{call.id}"})

    async def post_live(self, request: Request) -> Response:
        """A GPT-Live session over WebRTC; our ``ek_`` secrets are accepted as well as keys (our extra)."""
        credential = authorize(request, self.gateway, secrets_allowed=True)
        calls = self.calls
        if calls is None:
            raise HttpError(404, "WebRTC is off on this gateway ([webrtc] enabled, and the webrtc extra).",
                            "webrtc_disabled")
        client = request.client.host if request.client else ""
        if (held := self.gateway.secret_refusal(credential.owner, calls.pending_of(credential.owner))) is not None:
            raise HttpError(429, held, "too_many_sessions", kind="rate_limit_error")
        if (refusal := calls.unavailable(client)) is not None:
            raise HttpError(refusal.status, refusal.message, refusal.code,
                            kind="server_error" if refusal.status >= 500 else "rate_limit_error",
                            headers={"Retry-After": str(refusal.retry_after_s)})
        if request.headers.get("content-type", "").split(";", 1)[0].strip().lower() != "application/json":
            raise HttpError(415, "Send {session, transport} as application/json.", "unsupported_content_type")
        body = json_object(await read_body(request, MAX_OFFER_BYTES), "The body", "invalid_json")
        session = self.gateway.new_live_session(webrtc=True)
        try:
            check_fields(body, {"session", "transport"})
            transport = body.get("transport")
            if transport is None:
                raise ProtocolError("missing_required_parameter", "Missing required parameter: 'transport'.",
                                    "transport")
            if not isinstance(transport, dict) or transport.get("type") != "webrtc":
                raise ProtocolError("invalid_value", "'transport' must be {\"type\": \"webrtc\", \"sdp\": ...}.",
                                    "transport")
            check_fields(transport, {"type", "sdp"}, "transport")
            offer = transport.get("sdp")
            if not isinstance(offer, str):
                raise ProtocolError("missing_required_parameter", "Missing required parameter: 'transport.sdp'.",
                                    "transport.sdp")
            if "session" not in body:
                raise ProtocolError("missing_required_parameter", "Missing required parameter: 'session'.",
                                    "session")
            started = session.start(body["session"])
        except ProtocolError as exc:
            raise HttpError(400, exc.message, exc.code, exc.param) from None
        if (problem := offer_problem(offer) or calls.offer_problem(offer)) is not None:
            raise HttpError(400, problem, "invalid_offer", "transport.sdp")
        try:
            call, answer = await calls.answer_live(session, offer, client, started)
        except ConfigError as exc:
            raise HttpError(503, str(exc), "unavailable", kind="server_error") from None
        except Exception as exc:  # aiortc raises ValueError and others on offers it cannot use
            raise HttpError(400, f"The SDP offer cannot be used: {exc}", "invalid_offer", "transport.sdp") from None
        call.runner.owner = credential.owner
        log.info("Live call %s answered", call.id)
        return JSONResponse({"session": {"id": call.id}, "transport": {"type": "webrtc", "sdp": answer}}, 201)

    async def delete_call(self, request: Request) -> Response:
        credential = authorize(request, self.gateway, secrets_allowed=True)
        call = self.calls.calls.get(request.path_params["call_id"]) if self.calls else None
        if call is None or not credential.reaches(call.runner.owner):
            raise HttpError(404, "No such call.", "call_not_found")
        await call.close(client_gone=True)
        return Response(status_code=204)


def signalling_routes(signalling: Signalling) -> list[Route]:
    routes = []
    for prefix in ("/v1", ""):
        routes += [
            Route(prefix + "/realtime/calls", signalling.post_call, methods=["POST"]),
            Route(prefix + "/realtime/calls/{call_id}", signalling.delete_call, methods=["DELETE"]),
            Route(prefix + "/realtime", signalling.post_beta, methods=["POST"]),
            Route(prefix + "/live/sessions", signalling.post_live, methods=["POST"]),
        ]
    return routes
