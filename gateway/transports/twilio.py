"""Twilio Media Streams: a Twilio number's calls through the same call model as SIP's.

  POST /twilio/voice           Twilio's voice webhook → TwiML <Connect action=...><Stream url=...>
  WS   /twilio/stream/{token}  the bidirectional media stream
  POST /twilio/after/{token}   the <Connect action>: what the call does once the stream ends

The voice webhook (and the action) must carry a valid ``X-Twilio-Signature`` when the account's auth
token is configured ([twilio] auth_token_env): base64 HMAC-SHA1 of the URL Twilio called followed by the
sorted POST parameters, keyed with the token. The stream's URL carries a token the gateway mints for
that call: HMAC-SHA256 over the CallSid and an expiry ([twilio] stream_token_ttl_s), with a key drawn at
random when it starts, good for one stream (Twilio's Stream URL takes no query string; the path can carry
it). Nobody else can open a stream, and a refused handshake is a 403. Under ``serve --workers N`` any
worker answers the webhook, the stream's call lives in the worker its WebSocket reached (the workers share
the key and the tokens used), and the action is answered by the worker that holds the call's outcome.

On the stream (twilio.com/docs/voice/media-streams/websocket-messages), ``start`` makes the call pending
(the webhook goes out, or the default session answers); ``media`` is base64 mu-law at 8 kHz, 20 ms a
message; ``dtmf`` becomes ``input_audio_buffer.dtmf_event_received``; ``stop`` ends the call. The
agent's voice goes out as ``media`` at real time on the media clock (so what Twilio holds is one frame
and the playout queue knows what was heard), each response followed by a ``mark`` named after it; barge-in
sends ``clear``. Rejecting, referring or hanging up closes the stream; Twilio then asks the <Connect>
action what to do: <Reject>, <Dial> the referred number or address, or <Hangup>.

Other carriers' media streams (Telnyx's mirrors these events; Plivo, Vonage and Exotel differ in
framing) are not spoken here.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape, quoteattr

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import Receive, Scope, Send

from gateway.audio import RationalResampler, ulaw_decode, ulaw_encode
from gateway.config import ConfigError
from gateway.runtime.tally import Seen
from gateway.transports.calls.phone_calls import PhoneCall, PhoneCalls
from gateway.transports.calls.routing import HOP, CallRouter
from gateway.transports.calls.workers import CallWorkers
from gateway.transports.guard import is_loopback
from gateway.transports.playout import MediaClock, PlayoutQueue
from gateway.transports.rest import HttpError, read_body

if TYPE_CHECKING:
    from gateway.runtime.gateway import Gateway

log = logging.getLogger(__name__)

RATE, FRAME = 8000, 160
MAX_FORM_BYTES = 64 * 1024
MAX_MESSAGE_CHARS = 64 * 1024  # a media message is ~300 characters
MAX_OUTCOMES = 4096  # what each ended stream's call does next, kept until Twilio asks (or this many later)
GOING_AWAY = 1000


def twilio_signature(token: str, url: str, params: dict[str, str]) -> str:
    data = url + "".join(k + params[k] for k in sorted(params))
    return base64.b64encode(hmac.new(token.encode(), data.encode(), hashlib.sha1).digest()).decode()


class StreamTokens:
    """Tokens for the Stream URL: one CallSid, one use, a short life, the gateway's key (under ``serve --workers
    N`` the webhook and the stream may reach different workers: they share the key and the tokens used)."""

    def __init__(self, ttl_s: float, key: bytes | None = None, used: Seen | None = None) -> None:
        self.ttl_s = ttl_s
        self._key = key or secrets.token_bytes(32)
        self._used = used or Seen()

    def mint(self, call_sid: str) -> str:
        payload = base64.urlsafe_b64encode(f"{call_sid}|{int(time.time() + self.ttl_s)}".encode()).decode().rstrip("=")
        return payload + "." + self._tag(payload)

    def _tag(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()[:32]

    def redeem(self, token: str) -> str | None:
        """The CallSid a valid, unexpired, unused token names (now used), else None."""
        payload, _, tag = token.partition(".")
        if not hmac.compare_digest(tag, self._tag(payload)):
            return None
        try:
            call_sid, _, expiry = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode().partition("|")
            expires = float(expiry)
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return None
        if expires < time.time() or not self._used.use(token.encode(), expires):
            return None
        return call_sid


class TwilioLine:
    """A Twilio media stream as a call's line (gateway.transports.calls.phone_calls.Line)."""

    kind = "twilio"

    def __init__(self, twilio: Twilio, send: Any, start: dict[str, Any]) -> None:
        self.twilio = twilio
        self._send = send
        self.stream_sid = str(start.get("streamSid", ""))
        self.call_sid = str(start.get("callSid", ""))
        self.line_call_id = self.call_sid
        parameters = _object(start.get("customParameters"))
        self.source = str(parameters.get("From") or self.call_sid)
        self.headers = [("From", str(parameters.get("From", ""))), ("To", str(parameters.get("To", ""))),
                        ("X-Twilio-CallSid", self.call_sid)]
        self.headers += [(f"X-Twilio-{k}", str(v)) for k, v in parameters.items() if k not in ("From", "To")][:32]
        self.playout = ClearingPlayout(self)
        self.call: PhoneCall | None = None
        self.closed = asyncio.Event()
        self._upsample = RationalResampler(3, 1)
        self._response: str | None = None  # the response whose audio went out last (its mark follows it)

    async def send(self, event: dict[str, Any]) -> None:
        event["streamSid"] = self.stream_sid
        await self._send(orjson.dumps(event).decode())

    async def answer(self, call: PhoneCall) -> None:
        self.twilio.clock.add(self, self._tick)

    async def reject(self, status: int) -> None:
        self.twilio.outcomes[self.call_sid] = "<Reject/>" if status != 486 else '<Reject reason="busy"/>'
        self.closed.set()

    async def refer(self, target: str) -> None:
        number = target.removeprefix("tel:")
        verb = f"<Sip>{escape(target)}</Sip>" if target.startswith("sip") else f"<Number>{escape(number)}</Number>"
        self.twilio.outcomes[self.call_sid] = f"<Dial>{verb}</Dial>"
        self.closed.set()

    async def hang_up(self) -> None:
        self.twilio.outcomes.setdefault(self.call_sid, "<Hangup/>")
        self.closed.set()

    def send_dtmf(self, digits: str) -> bool:
        return False  # a media stream carries audio only

    def audio(self, payload: str) -> bytes:
        return self._upsample.process(ulaw_decode(base64.b64decode(payload, validate=True))).tobytes()

    async def _tick(self, now: float) -> None:
        frame, events = self.playout.take()
        call = self.call
        if np.any(frame) or events:
            await self.send({"event": "media", "media": {"payload": base64.b64encode(ulaw_encode(frame)).decode()}})
        for kind, response_id in events:
            if kind == "output_audio_buffer.stopped":
                await self.send({"event": "mark", "mark": {"name": response_id}})
            if call is not None:
                await call.playout_event(kind, response_id)

    def stop(self) -> None:
        self.twilio.clock.remove(self)
        self.closed.set()


class ClearingPlayout(PlayoutQueue):
    """The playout queue of a Twilio stream: clearing it also tells Twilio to drop what it holds."""

    def __init__(self, line: TwilioLine) -> None:
        super().__init__(RATE, FRAME, lambda: RationalResampler(1, 3))
        self.line = line

    def clear(self) -> tuple[str, float] | None:
        heard = super().clear()
        self.line.twilio.spawn(self.line.send({"event": "clear"}))
        return heard


class Twilio:
    def __init__(self, gateway: Gateway, calls: PhoneCalls, workers: CallWorkers | None = None) -> None:
        self.gateway = gateway
        self.calls = calls
        options = gateway.config.twilio
        self.public_url = options.public_url.rstrip("/")
        self.auth_token = os.environ.get(options.auth_token_env, "") if options.auth_token_env else ""
        if not self.auth_token and not is_loopback(gateway.config.server.host):
            raise ConfigError(f"option twilio.enabled: on a non-loopback address Twilio's webhooks must be signed: set "
                              f"the account's auth token in {options.auth_token_env or '[twilio] auth_token_env'}")
        self.router = CallRouter(workers)
        self.tokens = (StreamTokens(options.stream_token_ttl_s) if workers is None
                       else StreamTokens(options.stream_token_ttl_s, workers.key, workers.seen()))
        self.clock = MediaClock()
        self.outcomes: OrderedDict[str, str] = OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _form(self, request: Request) -> dict[str, str]:
        body = await read_body(request, MAX_FORM_BYTES)
        form = await request.form(max_fields=200)
        params = {k: str(v) for k, v in form.items()}
        if self.auth_token:
            url = self.public_url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
            given = request.headers.get("x-twilio-signature", "")
            if not hmac.compare_digest(given, twilio_signature(self.auth_token, url, params)):
                raise HttpError(403, "The X-Twilio-Signature does not match this request.", "invalid_signature")
        del body
        return params

    async def voice(self, request: Request) -> Response:
        params = await self._form(request)
        call_sid = params.get("CallSid", "")
        if not call_sid:
            raise HttpError(400, "Missing required parameter: 'CallSid'.", "missing_required_parameter")
        if (refusal := self.calls.refusal(params.get("From", call_sid))) is not None:
            log.info("Twilio call %s refused: %s", call_sid, refusal.message)
            return _twiml('<Reject reason="busy"/>')
        token = self.tokens.mint(call_sid)
        host = urlsplit(self.public_url)
        scheme = "wss" if host.scheme == "https" else "ws"
        parameters = "".join(f"<Parameter name={quoteattr(k)} value={quoteattr(params[k])}/>"
                             for k in ("From", "To", "CallerName") if params.get(k))
        return _twiml(f'<Connect action={quoteattr(f"{self.public_url}/twilio/after/{token}")}>'
                      f'<Stream url={quoteattr(f"{scheme}://{host.netloc}{host.path}/twilio/stream/{token}")}>'
                      f"{parameters}</Stream></Connect>")

    async def after(self, request: Request) -> Response:
        params = await self._form(request)
        verb = self.outcomes.pop(params.get("CallSid", ""), None)
        if verb is not None:
            return _twiml(verb)
        if request.scope.get(HOP):
            raise HttpError(404, "No outcome for this call here.", "not_found")
        # Under `serve --workers N` the stream may have ended in another worker: the one that has it says.
        for status, headers, content in await self.router.ask_others(request):
            if status == 200:
                return Response(content, headers=headers)
        return _twiml("<Hangup/>")

    async def stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # websocket.connect
        token = scope["path_params"]["token"]
        call_sid = self.tokens.redeem(token)
        if call_sid is None:
            log.info("Twilio stream refused: its token is wrong, expired or used")
            await send({"type": "websocket.http.response.start", "status": 403,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "websocket.http.response.body", "body": b"stream token refused"})
            return
        await send({"type": "websocket.accept"})
        gone = False

        async def send_text(text: str) -> None:
            nonlocal gone
            if not gone:
                try:
                    await send({"type": "websocket.send", "text": text})
                except OSError:
                    gone = True

        line: TwilioLine | None = None
        closer: asyncio.Task[Any] | None = None
        try:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    gone = True
                    break
                text = message.get("text") or ""
                if len(text) > MAX_MESSAGE_CHARS:
                    break
                try:
                    event = orjson.loads(text)
                    kind = event["event"]
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue  # not Twilio's: ignored
                if kind == "start" and line is None:
                    start = _object(event.get("start"))
                    if start.get("callSid") != call_sid:
                        break  # a stream for another call than the token's
                    line = TwilioLine(self, send_text, start)
                    if self.calls.refusal(line.source, taking=True) is not None:
                        break
                    line.call = self.calls.incoming(line)
                    closer = asyncio.ensure_future(self._close_when(line, send))
                elif line is None or line.call is None:
                    continue
                elif kind == "media":
                    runner = line.call.runner
                    payload = _object(event.get("media")).get("payload")
                    if runner is not None and line.call.state == "answered" and isinstance(payload, str):
                        with contextlib.suppress(ValueError, binascii.Error):
                            await runner.feed_audio(line.audio(payload))
                elif kind == "dtmf":
                    digit = _object(event.get("dtmf")).get("digit")
                    if isinstance(digit, str):
                        await line.call.dtmf(digit)
                elif kind == "stop":
                    break
                # "connected" says nothing new; "mark" echoes a mark once Twilio played the audio before it.
        finally:
            if closer is not None:
                closer.cancel()
            if line is not None:
                line.stop()
                if line.call is not None:
                    await line.call.ended()
            if not gone:
                with contextlib.suppress(OSError):
                    await send({"type": "websocket.close", "code": GOING_AWAY})

    async def _close_when(self, line: TwilioLine, send: Send) -> None:
        """Close the stream once the call is decided against (reject, refer, hang up)."""
        await line.closed.wait()
        while len(self.outcomes) > MAX_OUTCOMES:
            self.outcomes.popitem(last=False)
        with contextlib.suppress(OSError):
            await send({"type": "websocket.close", "code": GOING_AWAY})


def _twiml(verbs: str) -> Response:
    return Response(f'<?xml version="1.0" encoding="UTF-8"?><Response>{verbs}</Response>',
                    media_type="application/xml")


class _StreamEndpoint:
    """The stream as a plain ASGI app (Starlette would take a bound method for a WebSocket-session function)."""

    def __init__(self, twilio: Twilio) -> None:
        self.twilio = twilio

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.twilio.stream(scope, receive, send)


def twilio_routes(gateway: Gateway, calls: PhoneCalls, workers: CallWorkers | None = None) -> list[BaseRoute]:
    twilio = Twilio(gateway, calls, workers)
    return [Route("/twilio/voice", twilio.voice, methods=["POST"]),
            Route("/twilio/after/{token}", twilio.after, methods=["POST"]),
            WebSocketRoute("/twilio/stream/{token}", _StreamEndpoint(twilio))]


def _object(value: Any) -> dict[str, Any]:
    """A message's part that should be an object: anything else (a caller's mistake, or an attack) reads as
    empty, like a part left out."""
    return value if isinstance(value, dict) else {}
