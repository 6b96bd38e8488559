"""Call control over HTTP, as OpenAI's SIP API has it (each needs an API key, not a client secret):

  POST /v1/realtime/calls/{call_id}/accept   a Realtime session configuration → 200, empty body
  POST /v1/realtime/calls/{call_id}/reject   {status_code} (default 603) → 200
  POST /v1/realtime/calls/{call_id}/refer    {target_uri: "sip:..." | "tel:..."} → 200
  POST /v1/realtime/calls/{call_id}/hangup   → 200 (a WebRTC call's id too)
  POST /v1/realtime/calls/{call_id}/dtmf     {digits} → 200: keys played to the caller (this gateway's own)
  GET  /v1/realtime/calls                    the phone calls, pending and answered (the page's Calls view)

A call that is not in progress is a 404 ``call_not_found``; a second decision on a call a 409
``decision_already_made``; the gateway's room a 503 with Retry-After, as for any session. Under
``serve --workers N`` a request about a call another worker holds is passed on to it, and the listing
holds every worker's calls (routing.py).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.runtime.gateway import Gateway
from gateway.transports.calls.phone_calls import CallError, PhoneCalls
from gateway.transports.calls.routing import CallRouter
from gateway.transports.rest import HttpError, authorize, read_json_object, string_field

MAX_BODY_BYTES = 256 * 1024
# sip:, sips: or tel: and then no whitespace, quotes or angle brackets (the URI goes into a Refer-To header).
_TARGET = re.compile(r"^(sips?:[^\s<>\"]+|tel:\+?[0-9().\-]+)$")
MAX_TARGET_CHARS = 512

HangUpOther = Callable[[str], Awaitable[bool]]


class CallControl:
    def __init__(self, gateway: Gateway, calls: PhoneCalls | None, hang_up_other: HangUpOther | None = None,
                 router: CallRouter | None = None) -> None:
        """``hang_up_other``: ends a call of another transport (WebRTC) by id; True if it held one. ``router``:
        passes a request about another worker's call on to it."""
        self.gateway = gateway
        self.calls = calls
        self.hang_up_other = hang_up_other
        self.router = router or CallRouter(None)

    def _calls(self) -> PhoneCalls:
        if self.calls is None:
            raise HttpError(404, "Phone calls are off on this gateway ([sip] enabled, [twilio] enabled).",
                            "calls_disabled")
        return self.calls

    async def _body(self, request: Request) -> dict[str, Any]:
        authorize(request, self.gateway)
        return await read_json_object(request, MAX_BODY_BYTES)

    async def _elsewhere(self, request: Request) -> Response | None:
        """The answer of the worker that holds the call, when another one does (the body read first, bounded)."""
        call_id = request.path_params["call_id"]
        if self.calls is not None and self.calls.find(call_id) is not None:
            return None
        slot = self.router.owner(call_id, request.scope)
        return await self.router.forward(request, slot, call_id) if slot is not None else None

    async def accept(self, request: Request) -> Response:
        body = await self._body(request)
        if (answer := await self._elsewhere(request)) is not None:
            return answer
        return await self._do(self._calls().accept(request.path_params["call_id"], body))

    async def reject(self, request: Request) -> Response:
        body = await self._body(request)
        if (answer := await self._elsewhere(request)) is not None:
            return answer
        status = body.get("status_code", 603)
        if not isinstance(status, int) or isinstance(status, bool) or not 300 <= status <= 699:
            raise HttpError(400, "'status_code' must be a SIP status from 300 to 699.", "invalid_value", "status_code")
        return await self._do(self._calls().reject(request.path_params["call_id"], status))

    async def refer(self, request: Request) -> Response:
        body = await self._body(request)
        target = string_field(body, "target_uri", required=True, limit=MAX_TARGET_CHARS)
        assert target is not None
        if not _TARGET.match(target):
            raise HttpError(400, "'target_uri' must be a sip:, sips: or tel: URI.", "invalid_value", "target_uri")
        if (answer := await self._elsewhere(request)) is not None:
            return answer
        return await self._do(self._calls().refer(request.path_params["call_id"], target))

    async def hangup(self, request: Request) -> Response:
        await self._body(request)
        call_id = request.path_params["call_id"]
        if self.calls is not None and self.calls.find(call_id) is not None:
            return await self._do(self.calls.hang_up(call_id))
        if self.hang_up_other is not None and await self.hang_up_other(call_id):
            return Response(status_code=200)
        if (answer := await self._elsewhere(request)) is not None:
            return answer
        raise HttpError(404, f"No call '{call_id[:64]}' is in progress.", "call_not_found")

    async def dtmf(self, request: Request) -> Response:
        body = await self._body(request)
        digits = string_field(body, "digits", required=True, limit=64)
        assert digits is not None
        if (answer := await self._elsewhere(request)) is not None:
            return answer
        try:
            self._calls().send_dtmf(request.path_params["call_id"], digits)
        except CallError as exc:
            raise HttpError(exc.status, str(exc), exc.code) from None
        return Response(status_code=200)

    async def listing(self, request: Request) -> Response:
        authorize(request, self.gateway)
        calls = [call.wire() for call in self.calls.calls.values()] if self.calls is not None else []
        calls += await self.router.listing(request)
        calls.sort(key=lambda call: call["created_at"])
        body = {"object": "list", "data": calls}
        return Response(orjson.dumps(body), media_type="application/json", headers={"Cache-Control": "no-cache"})

    async def _do(self, decision: Awaitable[None]) -> Response:
        try:
            await decision
        except CallError as exc:
            headers = {"Retry-After": "1"} if exc.status == 503 else None
            raise HttpError(exc.status, str(exc), exc.code, kind="server_error" if exc.status >= 500
                            else "invalid_request_error", headers=headers) from None
        return Response(status_code=200)


def call_control_routes(control: CallControl) -> list[Route]:
    routes = []
    for prefix in ("/v1", ""):
        base = prefix + "/realtime/calls"
        routes += [
            Route(base, control.listing, methods=["GET"]),
            Route(base + "/{call_id}/accept", control.accept, methods=["POST"]),
            Route(base + "/{call_id}/reject", control.reject, methods=["POST"]),
            Route(base + "/{call_id}/refer", control.refer, methods=["POST"]),
            Route(base + "/{call_id}/hangup", control.hangup, methods=["POST"]),
            Route(base + "/{call_id}/dtmf", control.dtmf, methods=["POST"]),
        ]
    return routes
