"""Pending and live phone calls, and the decisions on them.

A line brings a call in (``incoming``): unless the gateway is full or draining, or the source already
holds its share of pending calls, the call is pending with an id ``rtc_...`` and the
``realtime.call.incoming`` webhook goes out; with no webhook configured it is accepted at once with
the [session] defaults. The first decision wins (a second one is ``decision_already_made``); a call
with none after ``[calls] decision_timeout_s`` is rejected. An accepted call is a Realtime session like
any other (``Gateway.new_session`` / ``new_runner`` / ``opened`` / ``close_session``): VAD and Smart
Turn, the responder, tools, MCP, voices, traces, metrics, session limits and drain. Its server events
go to its sideband connections (gateway/transports/sideband.py); the caller's keypad arrives as
``input_audio_buffer.dtmf_event_received``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Counter

from gateway.config import ConfigError
from gateway.realtime.events import Dialect, new_id
from gateway.runtime.gateway import Refusal, SessionRefused, configure
from gateway.transports.calls.webhooks import Webhooks, decode_secret
from gateway.transports.calls.workers import CallWorkers, new_call_id, tally
from gateway.transports.playout import PlayoutQueue
from gateway.transports.sideband import Sideband

if TYPE_CHECKING:
    from gateway.runtime.gateway import Gateway
    from gateway.runtime.session_runner import SessionRunner

log = logging.getLogger(__name__)

CALLS = Counter("gateway_phone_calls_total", "Phone calls by line and how they were decided",
                ["line", "decision"])
DTMF_DIGITS = frozenset("0123456789*#ABCD")
MAX_DECIDED_KEPT = 1024
MAX_DTMF_DIGITS = 32


class CallError(Exception):
    """A decision that cannot be carried out: HTTP ``status`` with an OpenAI-shaped error ``code``."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class Line(Protocol):
    """The phone side of a call: a SIP dialog or a Twilio media stream."""

    kind: str  # "sip" or "twilio"
    source: str  # the address the call came from (its pending calls are counted)
    line_call_id: str  # the line's own id of the call (SIP's Call-ID, Twilio's CallSid): in the call's trace
    headers: list[tuple[str, str]]  # what the webhook reports as sip_headers
    playout: PlayoutQueue  # the agent's voice, taken by the line's media clock

    async def answer(self, call: PhoneCall) -> None:
        """Connect the call (SIP: 200 OK); audio goes to ``call.runner`` from now on. CallError if it is gone."""

    async def reject(self, status: int) -> None:
        """Refuse the pending call with a SIP status (300-699)."""

    async def refer(self, target: str) -> None:
        """Send the caller elsewhere: a redirect while pending, a REFER once answered."""

    async def hang_up(self) -> None:
        """End the answered call from our side (SIP: BYE)."""

    def send_dtmf(self, digits: str) -> bool:
        """Play ``digits`` to the caller (RFC 4733 events); False when the line has no way to."""


class PhoneCall:
    def __init__(self, calls: PhoneCalls, line: Line) -> None:
        self.id = new_call_id(calls.slot)
        self.calls = calls
        self.line = line
        self.created = time.monotonic()
        self.created_at = int(time.time())
        self.state = "pending"  # then "answered", "ended"
        self.decision: str | None = None
        self.runner: SessionRunner | None = None
        self.sideband = Sideband()
        self._timer: asyncio.Task[None] | None = None

    def wire(self) -> dict[str, Any]:
        """The call as GET /v1/realtime/calls lists it (the page's Calls view)."""
        headers = dict((n.lower(), v) for n, v in self.line.headers)
        return {"id": self.id, "object": "realtime.call", "line": self.line.kind, "status": self.state,
                "created_at": self.created_at, "from": headers.get("from", ""), "to": headers.get("to", ""),
                "session_id": self.runner.session.settings.id if self.runner is not None else None}

    async def send(self, text: str) -> None:
        """The session's server events: to the sideband (a phone has nowhere else to show them)."""
        await self.sideband.send(text)

    async def dtmf(self, digit: str) -> None:
        """A key the caller pressed (the line decoded it)."""
        if self.runner is not None and digit in DTMF_DIGITS:
            await self.runner.send_event({"type": "input_audio_buffer.dtmf_event_received", "event": digit,
                                          "received_at": int(time.time())})

    async def playout_event(self, kind: str, response_id: str) -> None:
        """output_audio_buffer.started / .stopped, as the line's media clock reaches them."""
        if self.runner is None:
            return
        if kind == "output_audio_buffer.started":
            await self.runner.playout_started(response_id)
        else:
            await self.runner.playout_stopped(response_id)

    async def ended(self) -> None:
        """The line ended (the caller hung up, cancelled, or vanished)."""
        await self.calls.forget(self, client_gone=True)


class PhoneCalls:
    """This process's phone calls, pending and answered; under ``serve --workers N`` (``workers``) the pending
    calls count against [calls] max_pending_calls with every worker's, and a call's id names this worker
    (gateway.transports.calls.routing)."""

    def __init__(self, gateway: Gateway, workers: CallWorkers | None = None) -> None:
        self.gateway = gateway
        self.options = gateway.config.calls
        self.slot = workers.slot if workers is not None else 0
        self.calls: dict[str, PhoneCall] = {}
        self.pending = tally(workers, "pending_calls", lambda: (c.line.source for c in self.calls.values()
                                                                if c.state == "pending"))
        self.webhooks: Webhooks | None = None
        urls = [u.strip() for u in self.options.webhook_urls.split(",") if u.strip()]
        if urls:
            env = self.options.webhook_secret_env
            secret = os.environ.get(env, "") if env else ""
            if not secret:
                raise ConfigError(f"option calls.webhook_urls needs the webhook secret in the environment variable "
                                  f"{env or '(calls.webhook_secret_env is empty)'}")
            self.webhooks = Webhooks(urls, decode_secret(secret, env), self.options.webhook_timeout_s)
        self._tasks: set[asyncio.Task[Any]] = set()
        # Calls a rejection or a redirect ended, newest last: a second decision on one is a 409, not a 404.
        self._decided: OrderedDict[str, str] = OrderedDict()
        gateway.hold(self)

    # --- a line's side ----------------------------------------------------------------------------------

    def refusal(self, source: str, taking: bool = False) -> Refusal | None:
        """Why no call from ``source`` can come in now, or None; ``taking``: the call is counted in as pending
        (the workers share the bound), and ``incoming`` must follow at once."""
        if (refusal := self.gateway.unavailable()) is not None:
            return refusal
        full = self.pending.admit(source, self.options.max_pending_calls, self.options.max_pending_calls_per_source)
        if full is None and not taking:
            self.pending.refresh()
        pending = [c for c in self.calls.values() if c.state == "pending"]
        if full is not None and full.source:
            return Refusal("too_many_pending_calls", "This source has too many calls waiting for a decision "
                           "([calls] max_pending_calls_per_source).",
                           self._retry_after([c for c in pending if c.line.source == source]), 429)
        if full is not None:
            return Refusal("too_many_pending_calls", "Too many calls are waiting for a decision ([calls] "
                           "max_pending_calls).", self._retry_after(pending))
        return None

    def incoming(self, line: Line) -> PhoneCall:
        """A new pending call on ``line`` (``refusal`` said yes): its webhook goes out, or it is accepted."""
        call = PhoneCall(self, line)
        self.calls[call.id] = call
        call._timer = self._spawn(self._decision_timeout(call))
        log.info("call %s: incoming %s call from %s", call.id, line.kind, line.source)
        if self.webhooks is None:
            self._spawn(self._accept_default(call))
        else:
            self._spawn(self._notify(call))
        return call

    async def forget(self, call: PhoneCall, client_gone: bool = False) -> None:
        """The call is over: its session closed, its sideband closed, its slot freed."""
        if call.state == "ended":
            return
        if call.state == "pending":
            CALLS.labels(call.line.kind, "abandoned").inc()
        call.state = "ended"
        self.calls.pop(call.id, None)
        if call.decision in ("rejected", "referred"):
            self._decided[call.id] = call.decision
            while len(self._decided) > MAX_DECIDED_KEPT:
                self._decided.popitem(last=False)
        self.pending.refresh()
        if call._timer is not None and call._timer is not asyncio.current_task():
            call._timer.cancel()
        if call.runner is not None:
            await self.gateway.close_session(call.runner, client_gone)
        await call.sideband.close()
        log.info("call %s ended", call.id)

    # --- the application's decisions ----------------------------------------------------------------------

    def find(self, call_id: str) -> PhoneCall | None:
        return self.calls.get(call_id)

    def _pending(self, call_id: str) -> PhoneCall:
        call = self.calls.get(call_id)
        if call is None:
            raise self._missing(call_id)
        if call.decision is not None:
            raise CallError(409, f"A decision was already made on call '{call_id}' ({call.decision}).",
                            "decision_already_made")
        return call

    def _missing(self, call_id: str) -> CallError:
        if (decision := self._decided.get(call_id)) is not None:
            return CallError(409, f"A decision was already made on call '{call_id}' ({decision}).",
                             "decision_already_made")
        return CallError(404, f"No call '{call_id[:64]}' is in progress.", "call_not_found")

    async def accept(self, call_id: str, config: dict[str, Any]) -> None:
        """Answer the call with a Realtime session configured by ``config`` (the accept body)."""
        call = self._pending(call_id)
        gateway = self.gateway
        try:
            model = config.get("model")
            session = gateway.new_session(Dialect.GA, model=model if isinstance(model, str) else None,
                                          server_playout=True)
            if self.options.noise_reduction:
                configure(session, {"type": "realtime", "audio": {"input": {"noise_reduction": {
                    "type": self.options.noise_reduction}}}})
            configure(session, {k: v for k, v in config.items() if k != "model"})
        except SessionRefused as exc:
            raise CallError(400, str(exc), "invalid_session") from None
        if (refusal := gateway.admit()) is not None:
            raise CallError(503, refusal.message, refusal.code)
        call.decision = "accepted"
        runner = call.runner = gateway.new_runner(session, call.send, call.line.playout, trace_tags={
            "call_id": call.id, "line_call_id": call.line.line_call_id})
        gateway.opened(runner, f"{call.line.kind} call {call.id} from {call.line.source}", lambda: self.hang_up(call))
        try:
            await call.line.answer(call)
        except CallError as exc:
            await call.line.reject(503 if exc.status == 503 else 480)  # the caller is told, whatever happened
            await self.forget(call)
            raise
        call.state = "answered"
        self.pending.refresh()
        if call._timer is not None:
            call._timer.cancel()
        CALLS.labels(call.line.kind, "accepted").inc()
        await runner.start()

    async def reject(self, call_id: str, status: int = 603) -> None:
        call = self._pending(call_id)
        call.decision = "rejected"
        CALLS.labels(call.line.kind, "rejected").inc()
        await call.line.reject(status)
        await self.forget(call)

    async def refer(self, call_id: str, target: str) -> None:
        """Transfer: a pending call is redirected (a decision), an answered one is sent a REFER."""
        call = self.calls.get(call_id)
        if call is None:
            raise self._missing(call_id)
        if call.state == "pending":
            self._pending(call_id)
            call.decision = "referred"
            CALLS.labels(call.line.kind, "referred").inc()
            await call.line.refer(target)
            await self.forget(call)
            return
        await call.line.refer(target)

    async def hang_up(self, call: PhoneCall | str) -> None:
        """End the call from our side (a pending one is declined)."""
        if isinstance(call, str):
            found = self.calls.get(call)
            if found is None:
                raise CallError(404, f"No call '{call[:64]}' is in progress.", "call_not_found")
            call = found
        if call.state == "pending":
            await self.reject(call.id, 603)
            return
        if call.state == "answered":
            await call.line.hang_up()
        await self.forget(call)

    def send_dtmf(self, call_id: str, digits: str) -> None:
        call = self.calls.get(call_id)
        if call is None or call.state != "answered":
            raise CallError(404, f"No answered call '{call_id[:64]}'.", "call_not_found")
        if not digits or len(digits) > MAX_DTMF_DIGITS or not set(digits) <= DTMF_DIGITS:
            raise CallError(400, f"'digits' must be 1-{MAX_DTMF_DIGITS} of 0-9 * # A-D.", "invalid_value")
        if not call.line.send_dtmf(digits):
            raise CallError(400, "This call cannot play keys: a Twilio media stream has no way to, and a SIP caller "
                            "needs to offer telephone-event (RFC 4733).", "dtmf_unsupported")

    # --- webhook, default answer, timeout ---------------------------------------------------------------

    async def _notify(self, call: PhoneCall) -> None:
        assert self.webhooks is not None
        event = {"id": new_id("evt"), "object": "event", "type": "realtime.call.incoming",
                 "created_at": call.created_at,
                 "data": {"call_id": call.id, "sip_headers": [{"name": n, "value": v} for n, v in call.line.headers],
                          "sip_media_security": "rtp"}}
        delivered = await self.webhooks.deliver(event)
        if not delivered:
            log.info("call %s: no webhook receiver took it; it stays pending for %g s ([calls] decision_timeout_s)",
                     call.id, self.options.decision_timeout_s)

    async def _accept_default(self, call: PhoneCall) -> None:
        try:
            await self.accept(call.id, {})
        except CallError as exc:
            log.info("call %s: cannot be answered (%s)", call.id, exc)
            if call.state == "pending" and call.decision is None:
                await self.reject(call.id, 503 if exc.status == 503 else 480)

    async def _decision_timeout(self, call: PhoneCall) -> None:
        await asyncio.sleep(self.options.decision_timeout_s)
        if call.state == "pending" and call.decision is None:
            log.info("call %s: no decision in %g s ([calls] decision_timeout_s), rejected", call.id,
                     self.options.decision_timeout_s)
            call.decision = "timed out"
            CALLS.labels(call.line.kind, "timed_out").inc()
            await call.line.reject(480)
            await self.forget(call)

    def _retry_after(self, pending: list[PhoneCall]) -> int:
        """When the oldest of ``pending`` is decided at the latest (none here: those of other workers)."""
        if not pending:
            return max(1, math.ceil(self.options.decision_timeout_s))
        oldest = min(call.created for call in pending)
        return max(1, math.ceil(oldest + self.options.decision_timeout_s - time.monotonic()))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("a phone call's task failed", exc_info=exc)

    # --- HeldConnections: drain and stop ---------------------------------------------------------------

    async def close_pending(self) -> None:
        """A drain begins: calls not answered yet are turned away (503)."""
        for call in [c for c in self.calls.values() if c.state == "pending"]:
            call.decision = "draining"
            await call.line.reject(503)
            await self.forget(call)

    async def stop(self) -> None:
        for call in list(self.calls.values()):
            if call.state == "answered":
                await call.line.hang_up()
            elif call.state == "pending":
                await call.line.reject(503)
            await self.forget(call)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.webhooks is not None:
            await self.webhooks.aclose()
