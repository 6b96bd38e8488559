"""Runs one GPT-Live session in the event loop: carries out its effects, owns its 100 ms output clock, and fans its
events out to the primary connection (a WebSocket or a WebRTC data channel) and the sidebands attached to it.

The core (gateway/live/session.py) says what each tick holds once the timeline (the input audio) has reached it;
the runner paces the ticks at real time at most, so a client that streams faster than real time gets its output
at real-time pace (and waits for it once it is ``[live] max_lead_ms`` ahead). Sessions end as the core says
(session.close), at ``expires_at``, after ``[live] no_audio_timeout_s`` without input audio (both "expired"), or
when the primary connection goes (``connection_lost``, told to the sidebands).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any

import orjson

from gateway.core.effects import SendEvent
from gateway.core.ids import new_id
from gateway.core.responder import Responder, Transcriber
from gateway.core.values import ProtocolError
from gateway.live.effects import DelegationRequest, EndSession, Reflect, Reply, RunDelegation, StopDelegation
from gateway.live.events import error_event
from gateway.live.session import LiveSession
from gateway.live.settings import data_channel_lists, server_event_allowed
from gateway.live.timeline import TICK_MS
from gateway.realtime.events import Dialect
from gateway.realtime.outputs import McpError
from gateway.realtime.tools import NAME, McpPolicy, McpRoute, McpServer, McpTool, parse_tools
from gateway.responders.delegation import DelegationBackend
from gateway.runtime.core_runner import CoreRunner, Send
from gateway.runtime.mcp_client import McpClient, McpFailure
from gateway.runtime.silero import SileroVAD, VadBatcher
from gateway.runtime.smart_turn import SmartTurn
from gateway.runtime.trace import TurnTrace

log = logging.getLogger(__name__)

# A connection's end (the primary's or a sideband's): close it with this WebSocket code.
End = Callable[[int], Awaitable[None]]
WATCH_S = 1.0  # how often the session's lifetime and input are checked


class LiveRunner(CoreRunner):
    session: LiveSession
    shape = "GPT-Live"

    def __init__(
        self,
        session: LiveSession,
        responder: Responder,
        vad: SileroVAD,
        send: Send,
        backend: DelegationBackend | None,
        vad_batcher: VadBatcher | None = None,
        trace: TurnTrace | None = None,
        transcriber: Transcriber | None = None,
        smart_turn: SmartTurn | None = None,
        on_backend_error: Callable[[str], None] | None = None,
    ) -> None:
        """``send``: the primary connection's; ``backend``: the Responses delegation's (None: none configured)."""
        super().__init__(session, session.id, responder, vad, send, vad_batcher, trace, transcriber, smart_turn,
                         on_backend_error)
        self.backend = backend
        self.mcp = McpClient(session.config.mcp)  # our MCP servers' tools, in Responses delegation
        self.end_primary: End | None = None  # set by the transport
        self.media: Callable[[bytes], None] | None = None  # WebRTC: the outbound track takes each tick's audio
        self.sidebands: dict[object, tuple[Send, End]] = {}
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._clock: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._advanced = asyncio.Event()  # the timeline moved: a tick may be due
        self._ticked = asyncio.Event()  # a tick went out: a client held back may go on
        self._last_input = time.monotonic()
        self.ended = asyncio.Event()  # session.closed is out

    @property
    def session_id(self) -> str:
        return self.session.id

    # --- the transports' calls -----------------------------------------------------------------------

    async def start(self, effects: Iterable[Any] = ()) -> None:
        """Start the clocks; ``effects``: the start's own (a WebRTC session starts with its HTTP request)."""
        self._clock = asyncio.create_task(self._run_clock())
        self._watch = asyncio.create_task(self._watchdog())
        await self._apply(effects)

    async def receive(self, message: str | bytes, sideband: object | None = None) -> None:
        """One client message from the primary connection or a sideband (``sideband``: its key)."""
        timeline = self.session.timeline_ms
        effects = self.session.handle(message, sideband=sideband is not None)
        if sideband is not None and (to := self.sidebands.get(sideband)) is not None:
            for reply in [e for e in effects if isinstance(e, Reply)]:  # a sideband's refusals are its own
                await to[0](orjson.dumps(reply.event).decode())
            effects = [e for e in effects if not isinstance(e, Reply)]
        await self._apply(effects)
        await self._after_input(timeline)

    async def feed_audio(self, pcm: bytes) -> None:
        """Input audio from a media track (pcm16 24 kHz)."""
        timeline = self.session.timeline_ms
        await self._apply(self.session.input_audio(pcm))
        await self._after_input(timeline)

    async def _after_input(self, timeline: int) -> None:
        if self.session.timeline_ms != timeline:
            self._last_input = time.monotonic()
            self._advanced.set()
        await self._wait_vad()
        # Back-pressure: a client far ahead of the output's pace waits for it.
        while self.session.ticks_due * TICK_MS > self.session.live.max_lead_ms and not self._closed:
            self._ticked.clear()
            await self._ticked.wait()

    async def attach(self, key: object, send: Send, end: End) -> None:
        """A sideband joins: it gets session.started, then every event."""
        self.sidebands[key] = (send, end)
        if self.session.started and not self.session.closed:
            await send(orjson.dumps(self.session.started_event()).decode())

    async def send_event(self, event: dict[str, Any]) -> None:
        """A server event from outside the session (a draining gateway's notice, Realtime-shaped): as a Live
        error with its code and message."""
        if event.get("type") == "error":
            error = event["error"]
            event = error_event(error["code"], error["message"], error_type=error["type"])
        await self._apply([SendEvent(event)])

    def detach(self, key: object) -> None:
        self.sidebands.pop(key, None)

    async def lost(self) -> None:
        """The primary connection went without session.close: the sidebands hear so."""
        await self._apply(self.session.close("connection_lost"))

    async def expire(self) -> None:
        await self._apply(self.session.close("expired"))

    def _tasks(self) -> list[asyncio.Task[Any] | None]:
        return [*super()._tasks(), *self._runs.values(), self._clock, self._watch]

    def _forget_tasks(self) -> None:
        super()._forget_tasks()
        self._runs.clear()

    # --- effects -------------------------------------------------------------------------------------

    async def _carry_out(self, effect: Any) -> None:
        match effect:
            case Reflect():
                if self.sidebands:
                    await self._to_sidebands(effect.wire())
            case Reply(event):
                await self._send_event(event)
            case RunDelegation(run_id, request):
                if self.backend is None:  # refused at session.start: cannot happen
                    await self._apply(self.session.backend_finished(run_id, "no delegation backend"))
                    return
                task = asyncio.create_task(self._run_backend(run_id, request), context=self._context)
                self._runs[run_id] = task
                task.add_done_callback(lambda _, rid=run_id: self._runs.pop(rid, None))
            case StopDelegation(run_id):
                if (task := self._runs.get(run_id)) is not None:
                    task.cancel()
            case EndSession():
                self.ended.set()
                await self._end_all()
            case _:
                raise TypeError(f"not an effect: {effect!r}")

    def _mark(self, name: str, response_id: str | None) -> None:
        if name in ("delegation_created", "commentary_appended", "commentary_spoken"):
            self.trace.moment(name)
        else:
            super()._mark(name, response_id)

    async def _send_event(self, event: dict[str, Any]) -> None:
        if self._closed:
            return
        self.trace.sent(event)
        text = orjson.dumps(event).decode()
        if self._primary_gets(event):
            await self._send(text)
        if event["type"] != "session.output_audio.delta":  # the sidebands get it reflected, with its times
            for send, _ in list(self.sidebands.values()):
                await send(text)

    def _primary_gets(self, event: dict[str, Any]) -> bool:
        session = self.session
        if not session.webrtc or session.settings is None:
            return True
        if event["type"] == "session.output_audio.delta":
            if self.media is not None:  # the media track carries it (pcm16 24 kHz: WebRTC sessions have no format)
                self.media(base64.b64decode(event["delta"]))
            return False
        return server_event_allowed(event, data_channel_lists(session.settings)[1])

    async def _to_sidebands(self, event: dict[str, Any]) -> None:
        if self.sidebands and not self._closed:
            text = orjson.dumps(event).decode()
            for send, _ in list(self.sidebands.values()):
                await send(text)

    async def _end_all(self) -> None:
        for _, end in list(self.sidebands.values()):
            await end(1000)
        if self.end_primary is not None:
            await self.end_primary(1000)

    # --- the clocks ----------------------------------------------------------------------------------

    async def _run_clock(self) -> None:
        """One tick per 100 ms of timeline, at real-time pace at most: the first at once, each later one when the
        timeline has reached it and 100 ms after the one before; a timeline that stalled starts the pace anew."""
        loop = asyncio.get_running_loop()
        origin, sent = loop.time(), 0
        while not self._closed:
            if self.session.ticks_due <= 0:
                self._advanced.clear()
                await self._advanced.wait()
                origin, sent = loop.time(), 0
            await self._apply(self.session.tick())
            sent += 1
            self._ticked.set()
            await asyncio.sleep(max(0.0, origin + sent * TICK_MS / 1000 - loop.time()))

    async def _watchdog(self) -> None:
        live = self.session.live
        while not self._closed and not self.session.closed:
            await asyncio.sleep(WATCH_S)
            if not self.session.started:
                continue
            if time.time() >= self.session.expires_at:
                log.info("session %s reached its expires_at ([live] max_session_s)", self.session_id)
                await self.expire()
            elif time.monotonic() - self._last_input >= live.no_audio_timeout_s:
                log.info("session %s: no input audio for %g s ([live] no_audio_timeout_s), closing",
                         self.session_id, live.no_audio_timeout_s)
                await self.expire()

    async def _run_backend(self, run_id: str, request: DelegationRequest) -> None:
        """A delegated run: the backend's events into the session; calls of our MCP servers' tools are made here
        (as mcp_call items) and the backend goes on with their outputs, for [mcp] max_rounds rounds at most."""
        assert self.backend is not None
        error: str | None = None
        try:
            routes, request = await self._with_mcp(request)
            for _ in range(self.session.config.mcp.max_rounds + 1):
                held = await self._backend_round(run_id, request, routes)
                if not held:
                    break
                outputs = [await self._call_mcp(run_id, routes[item["name"]], item) for item in held]
                calls = [{k: item[k] for k in ("type", "call_id", "name", "arguments")} for item in held]
                request = replace(request, input=[*request.input, *calls, *outputs])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the backend's failure ends this run, never the session
            log.warning("delegated response %s failed: %s", run_id, exc)
            error = str(exc)
        await self._apply(self.session.backend_finished(run_id, error))

    async def _backend_round(self, run_id: str, request: DelegationRequest,
                             routes: dict[str, McpRoute]) -> list[dict[str, Any]]:
        """One backend response, its events passed on but for those of MCP calls: those calls, returned."""
        assert self.backend is not None
        held: list[dict[str, Any]] = []
        ours: set[str] = set()  # the MCP calls' item ids
        async for event in self.backend.run(request):
            item = event.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") in routes:
                ours.add(str(item.get("id")))
                if event["type"] == "response.output_item.done":
                    held.append(item)
                continue
            if event.get("item_id") in ours:
                continue  # their arguments' deltas
            await self._apply(self.session.backend_event(run_id, event))
        return held

    async def _with_mcp(self, request: DelegationRequest) -> tuple[dict[str, McpRoute], DelegationRequest]:
        """The request with each MCP server's tools as functions the backend may call (named label__tool). Live
        has no approval events: only the tools a server's require_approval exempts are offered."""
        servers = [t for t in request.tools if t.get("type") == "mcp"]
        if not servers:
            return {}, request
        cfg = self.session.config.mcp
        policy = McpPolicy(cfg.enabled, cfg.allowed_hosts, cfg.max_servers)
        try:
            parsed = parse_tools(servers, "session.delegation.responses.tools", Dialect.GA, policy)
        except ProtocolError as exc:
            raise McpFailure(McpError("protocol_error", exc.message)) from None
        functions = [t for t in request.tools if t.get("type") == "function"]
        listed = []
        for server in parsed:
            assert isinstance(server, McpServer)
            listed.append((server, await self.mcp.list_tools(server)))
        routes, offered = mcp_functions(listed, {str(t.get("name")) for t in functions})
        return routes, replace(request, tools=functions + offered)

    async def _call_mcp(self, run_id: str, route: McpRoute, call: dict[str, Any]) -> dict[str, Any]:
        """Make the call; its mcp_call item goes to the session, its output back to the backend."""
        item: dict[str, Any] = {"type": "mcp_call", "id": new_id("mcp"), "server_label": route.server.server_label,
                                "name": route.tool.name, "arguments": call.get("arguments") or "{}"}
        try:
            output = await self.mcp.call(route.server, route.tool.name, item["arguments"])
            item.update(output=output, error=None, status="completed")
        except McpFailure as exc:
            output = f"The tool failed: {exc.error.message}"
            item.update(output=None, error=exc.error.wire(), status="failed")
        await self._apply(self.session.backend_event(run_id, {"type": "response.output_item.done",
                                                              "output_index": 0, "item": item}))
        return {"type": "function_call_output", "call_id": call["call_id"], "output": output}


def mcp_functions(listed: list[tuple[McpServer, list[McpTool]]],
                  taken: set[str]) -> tuple[dict[str, McpRoute], list[dict[str, Any]]]:
    """The functions standing for the servers' tools that need no approval, named label__tool, and what each
    name calls. A name the backend would refuse, or one ``taken``, is not offered: cut short, two names
    could become one, and a call of one would run the other."""
    routes: dict[str, McpRoute] = {}
    functions: list[dict[str, Any]] = []
    for server, tools in listed:
        for tool in tools:
            name = f"{server.server_label}__{tool.name}"
            if not server.allows(tool) or server.needs_approval(tool) or not NAME.match(name) or name in taken:
                continue
            taken.add(name)
            routes[name] = McpRoute(server, tool)
            functions.append({"type": "function", "name": name, "description": tool.description or "",
                              "parameters": tool.input_schema})
    return routes, functions
