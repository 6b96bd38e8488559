"""A session's responses: started (response.create's body is read in gateway/realtime/response_params.py), the
response's output turned into events, its end.

One response of the conversation is active at a time (``active``); out-of-band responses
(``conversation: "none"``, whose output joins no conversation) may run beside it, at most [session]
max_out_of_band_responses of them, and user speech never cancels them. Each produces output items in
order (gateway/realtime/outputs.py): what its responder yields becomes an assistant message (speech or
text), function calls the client runs, MCP calls the gateway runs and MCP approval requests. A response
makes one LLM call (StartResponse) and ends with it, as OpenAI's do: MCP calls it started go on running
after its response.done, and their results are told as they come (response.mcp_call.completed,
conversation.item.done); the client's next response.create lets the LLM answer with them, after any call
still running has ended. A response that runs calls the client approved makes no LLM call, and an approval
added while no response runs starts one by itself. ``finish`` closes what is still open and sends
response.done; anything yielded for a response that is no longer running is dropped here, so nothing of a
cancelled response follows its response.done.

A truncate does not end the response (the client cancels if it wants to): what the response yields
after it still goes out as deltas, but the item keeps only what was heard up to the truncation.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from gateway.audio import OutputEncoder
from gateway.core.responder import (
    AudioOut,
    LlmUsage,
    ReplyCut,
    ResponseOutput,
    ResponseRequest,
    SpeechText,
    TextOut,
    ToolCallArguments,
    ToolCallStart,
    TraceMark,
)
from gateway.realtime.conversation import BYTES_PER_MS, Conversation, EventMaker, Item, snapshot
from gateway.realtime.effects import CallMcp, Effect, Mark, Play, PlayoutEnd, StartResponse, StopResponse
from gateway.realtime.events import Dialect, ProtocolError, new_id
from gateway.realtime.listings import McpListings
from gateway.realtime.outputs import (
    FunctionCallOut,
    McpApprovalOut,
    McpCallOut,
    McpError,
    MessageOut,
    Output,
    OutputScope,
    Round,
    Usage,
)
from gateway.realtime.response_params import parse_response
from gateway.realtime.settings import SessionSettings, format_wire
from gateway.realtime.tools import (
    LlmTools,
    McpPolicy,
    McpRoute,
    McpServer,
    Tool,
    llm_tools,
)

CANCELLED = McpError("tool_execution_error", "The response was cancelled before the call finished.")


@dataclass
class Response:
    id: str
    modalities: list[str]
    voice: str
    output_format: str
    in_conversation: bool
    max_output_tokens: int | str
    metadata: dict[str, Any] | None
    instructions: str
    temperature: float | None  # None: the backend's own (the client set none)
    tools: list[Tool]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool | None
    input_items: list[Item] | None  # response.input: the items it sees instead of the conversation
    scope: OutputScope
    speed: float  # the session's audio.output.speed
    outputs: list[Output] = field(default_factory=list)
    message: MessageOut | None = None  # the message being produced
    round: Round = field(default_factory=Round)
    llm: LlmTools = field(default_factory=LlmTools)  # the tools of its LLM call
    responding: bool = False  # a responder runs (between StartResponse and response_finished)
    llm_due: bool = True  # its LLM call is still to make, once listings and earlier MCP calls are done
    cut: bool = False  # the LLM stopped at its token limit
    listings: set[str] = field(default_factory=set)  # mcp_list_tools items it waits for
    next_message_id: str = field(default_factory=lambda: new_id("item"))
    usage: Usage = field(default_factory=Usage)
    audio_ms: float = 0.0

    @property
    def audio(self) -> bool:
        return "audio" in self.modalities

    def running_calls(self) -> list[McpCallOut]:
        return [o for o in self.outputs if isinstance(o, McpCallOut) and o.running]

    def producing(self, item: Item) -> bool:
        """Whether ``item`` is one of this response's output items that is not finished yet."""
        return any(o.item is item and not o.closed for o in self.outputs)

    def holds(self, item: Item) -> bool:
        return any(o.item is item for o in self.outputs)


class Responses:
    def __init__(self, event: EventMaker, conversation: Conversation, listings: McpListings, dialect: Dialect,
                 server_playout: bool, policy: McpPolicy, max_out_of_band: int,
                 on_finish: Callable[[Response], list[Effect]]) -> None:
        """``max_out_of_band``: out-of-band responses at once; ``on_finish``: told of each response that ends,
        its effects follow the response.done."""
        self._event = event
        self._conversation = conversation
        self._listings = listings
        self._dialect = dialect
        self._server_playout = server_playout
        self._policy = policy
        self._on_finish = on_finish
        self._max_out_of_band = max_out_of_band
        self.active: Response | None = None  # the conversation's response
        self.out_of_band: dict[str, Response] = {}  # conversation "none": they run beside it
        self.calls: dict[str, McpCallOut] = {}  # MCP calls running, by item id (they may outlive their response)
        self._approvals_run: set[str] = set()  # the approval requests whose call has run
        self.voice_locked = False  # audio has gone out: the session's voice is fixed

    def start(self, body: dict[str, Any], settings: SessionSettings, voices: Collection[str] | None) -> list[Effect]:
        """A new response from response.create's ``response`` (or {} for a turn's automatic one)."""
        params = parse_response(body, settings, self._dialect, voices, self._policy)
        self._listings.check(params.tools, "response.tools")
        if params.in_conversation and self.active is not None:
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.active.id}. "
                "Wait until the response is finished before creating a new one, or create an out-of-band one "
                "(conversation: \"none\").",
            )
        if not params.in_conversation and len(self.out_of_band) >= self._max_out_of_band:
            raise ProtocolError(
                "too_many_active_responses",
                f"This session already runs {len(self.out_of_band)} out-of-band responses, as many as it may "
                "([session] max_out_of_band_responses); wait until one is finished.", "response.conversation",
            )
        # An out-of-band context replaces the conversation for this response ("input": items or references).
        input_items = self._input(params.input) if params.input is not None else None
        rid = new_id("resp")
        resp = Response(
            id=rid,
            modalities=params.modalities,
            voice=params.voice,
            output_format=params.output_format,
            in_conversation=params.in_conversation,
            max_output_tokens=params.max_output_tokens,
            metadata=params.metadata,
            instructions=params.instructions,
            temperature=params.temperature,
            tools=params.tools,
            tool_choice=params.tool_choice,
            parallel_tool_calls=params.parallel_tool_calls,
            input_items=input_items,
            scope=OutputScope(rid, self._event, self._conversation, params.in_conversation),
            speed=settings.speed,
        )
        if resp.in_conversation:
            self.active = resp
        else:
            self.out_of_band[rid] = resp
        effects: list[Effect] = [
            Mark("response_created", resp.id),
            *self._event("response.created", response=self._wire(resp, "in_progress")),
            *self._event("rate_limits.updated", rate_limits=[]),
        ]
        effects += self._listings.refresh(resp.tools)
        resp.listings = self._listings.pending(resp.tools)
        approved = self._run_approved(resp)
        resp.llm_due = not approved  # the LLM answers once their results are in: at the next response.create
        return effects + approved + self._advance(resp)

    # --- what the responder yields ------------------------------------------------------------------

    def output(self, response_id: str, out: ResponseOutput) -> list[Effect]:
        """Something the responder of ``response_id`` produced; dropped if that response has ended."""
        resp = self.running(response_id)
        if resp is None:
            return []
        if isinstance(out, TraceMark):
            return [Mark(out.name, response_id)]
        if isinstance(out, LlmUsage):
            resp.usage.add(out.input_tokens, out.output_tokens, out.cached_tokens)
            return []
        if isinstance(out, ReplyCut):
            resp.cut = True
            return []
        if isinstance(out, ToolCallStart):
            return self._call_started(resp, out)
        if isinstance(out, ToolCallArguments):
            call = resp.round.calls.get(out.index)
            if call is None or call.closed or isinstance(call, McpCallOut) and call.running:
                return []  # a call closed when the next began: its arguments were whole
            return call.arguments(out.delta)
        if isinstance(out, AudioOut):
            if not resp.audio or not out.pcm:
                return []
            effects: list[Effect] = [] if resp.audio_ms else [Mark("first_delta", response_id)]
            effects += self._message(resp)
            message = resp.message
            assert message is not None
            self.voice_locked = True
            if not message.item.truncated:
                self._conversation.add_audio(message.item, out.pcm)
                effects += self._conversation.make_room(keep=message.item)
            resp.audio_ms += len(out.pcm) / BYTES_PER_MS
            if self._server_playout:
                return effects + [Play(resp.id, message.id, out.pcm)]
            return effects + message.audio_delta(out.pcm)
        if isinstance(out, SpeechText | TextOut) and out.text:
            effects = self._message(resp)
            assert resp.message is not None
            return effects + resp.message.text(out.text)
        return []

    def running(self, response_id: str) -> Response | None:
        """The response ``response_id`` if it has not ended (the conversation's or an out-of-band one)."""
        if self.active is not None and self.active.id == response_id:
            return self.active
        return self.out_of_band.get(response_id)

    def all_running(self) -> list[Response]:
        return ([self.active] if self.active is not None else []) + list(self.out_of_band.values())

    def _message(self, resp: Response) -> list[Effect]:
        """Open a message item for speech or text if none is open."""
        if resp.message is not None:
            return []
        resp.message = MessageOut(resp.scope, len(resp.outputs), resp.next_message_id, resp.audio,
                                  OutputEncoder(resp.output_format))
        resp.next_message_id = new_id("item")
        resp.outputs.append(resp.message)
        return resp.message.open()

    def _close_message(self, resp: Response, completed: bool) -> list[Effect]:
        message, resp.message = resp.message, None
        if message is None:
            return []
        # The encoder's resampler holds back its last few ms: they belong to a completed message only.
        return message.close(completed, flush=completed and not self._server_playout)

    def _call_started(self, resp: Response, out: ToolCallStart) -> list[Effect]:
        effects = self._close_message(resp, completed=True)  # speech before a call ("let me check") is done
        # The LLM streams parallel calls one after another: the one before is whole, and its item ends before
        # this one's begins, as OpenAI's do (an MCP call starts running).
        effects += self._end_calls(resp)
        route = resp.llm.mcp.get(out.name)
        index = len(resp.outputs)
        call: FunctionCallOut | McpCallOut | McpApprovalOut
        if route is None:
            call = FunctionCallOut(resp.scope, index, out.call_id, out.name)
        elif route.server.needs_approval(route.tool):
            call = McpApprovalOut(resp.scope, index, route)
        else:
            call = McpCallOut(resp.scope, index, route)
        resp.round.calls[out.index] = call
        resp.outputs.append(call)
        return effects + call.open()

    def sync_transcript(self) -> None:
        """The open message's transcript so far into its item (it is set whole at the end): a truncate
        cuts it at the words heard."""
        resp = self.active
        if resp is not None and resp.message is not None:
            resp.message.sync_transcript()

    # --- rounds ---------------------------------------------------------------------------------------

    def round_finished(self, response_id: str) -> list[Effect]:
        """The responder of ``response_id`` ended normally: close its items, start its MCP calls, and end."""
        resp = self.running(response_id)
        if resp is None:
            return []
        resp.responding = False
        effects = self._close_message(resp, completed=not resp.cut) + self._end_calls(resp)
        if resp.cut:  # at its token limit: OpenAI's incomplete response
            return effects + self.finish(resp, "incomplete", "max_output_tokens")
        return effects + self._advance(resp)

    def _end_calls(self, resp: Response) -> list[Effect]:
        """Close the round's calls whose arguments are whole; an MCP call runs instead (its result closes it)."""
        effects: list[Effect] = []
        for call in resp.round.calls.values():
            if call.closed or isinstance(call, McpCallOut) and call.running:
                continue
            effects += self._run(resp, call, streamed=True) if isinstance(call, McpCallOut) else \
                call.close(completed=True)
        return effects

    def mcp_call_finished(self, item_id: str, output: str | None, error: McpError | None) -> list[Effect]:
        """A call's result, whether its response runs or has ended; the responses waiting for it go on."""
        call = self.calls.pop(item_id, None)
        if call is None:
            return []  # cancelled with its response
        effects = call.finish(output, error)
        for resp in self.all_running():
            effects += self._advance(resp)
        return effects

    def listed(self, item_id: str) -> list[Effect]:
        """An MCP server's listing ended: the responses waiting for it may go on."""
        effects: list[Effect] = []
        for resp in self.all_running():
            if item_id in resp.listings:
                resp.listings.discard(item_id)
                effects += self._advance(resp)
        return effects

    def _advance(self, resp: Response) -> list[Effect]:
        """Make the LLM call, or finish, once nothing the response waits for is left: its listings, and
        before its LLM call the MCP calls whose results it would see. An out-of-band response holds its own
        calls' results, so it ends with them; the conversation's ends as soon as its LLM call has."""
        if resp.listings or resp.responding:
            return []
        if not resp.llm_due:
            if not resp.in_conversation and resp.running_calls():
                return []
            return self.finish(resp, "completed")
        if any(c.scope.in_conversation for c in self.calls.values()) if resp.in_conversation else \
                resp.running_calls():
            return []
        resp.responding = True
        resp.llm_due = False
        resp.round = Round()
        resp.llm = llm_tools(resp.tools, resp.tool_choice, self._listings.listed())
        items = resp.input_items if resp.input_items is not None else self._conversation.items()
        # Audio in the context, at OpenAI's rates: user audio 1 token per 100 ms, assistant 1 per 50 ms.
        resp.usage.audio_in = round(sum(
            len(i.audio) / BYTES_PER_MS / (100 if i.data.get("role") == "user" else 50) for i in items))
        request = ResponseRequest(
            response_id=resp.id,
            item_id=resp.next_message_id,
            instructions=resp.instructions,
            messages=self._conversation.messages(items),
            voice=resp.voice,
            modalities=resp.modalities,
            max_output_tokens=resp.max_output_tokens if isinstance(resp.max_output_tokens, int) else None,
            temperature=resp.temperature,
            tools=resp.llm.tools,
            tool_choice=resp.llm.tool_choice,
            parallel_tool_calls=resp.parallel_tool_calls if resp.llm.tools else None,
            speed=resp.speed,
        )
        return [StartResponse(request)]

    def _run(self, resp: Response, call: McpCallOut, streamed: bool) -> list[Effect]:
        data = call.item.data
        self.calls[call.id] = call
        return [*call.start(streamed),
                CallMcp(resp.id, call.id, call.route.server, call.route.tool.name, data["arguments"])]

    def approved(self, tools: list[Tool]) -> list[tuple[Item, McpRoute]]:
        """The calls the client has approved that have not run yet (approval requests and their routes
        among ``tools``): a server or tool gone from them since the request is left out."""
        items = self._conversation.items()
        approved = {i.data["approval_request_id"] for i in items
                    if i.data["type"] == "mcp_approval_response" and i.data["approve"]}
        servers = {t.server_label: t for t in tools if isinstance(t, McpServer)}
        listed = self._listings.listed()
        calls = []
        for item in items:
            data = item.data
            if data["type"] != "mcp_approval_request" or item.id not in approved or item.id in self._approvals_run:
                continue
            server = servers.get(data["server_label"])
            tool = next((t for t in listed.get(server.key, []) if t.name == data["name"]), None) if server else None
            if server is not None and tool is not None:
                calls.append((item, McpRoute(server, tool)))
        return calls

    def _run_approved(self, resp: Response) -> list[Effect]:
        """The MCP calls the client approved since the last response: they run in this one."""
        effects: list[Effect] = []
        for request, route in self.approved(resp.tools):
            self._approvals_run.add(request.id)  # one approval, one call: whatever becomes of its item
            call = McpCallOut(resp.scope, len(resp.outputs), route, request.data["arguments"], request.id)
            resp.outputs.append(call)
            effects += call.open() + self._run(resp, call, streamed=False)
        return effects

    # --- the end --------------------------------------------------------------------------------------

    def finish(self, resp: Response, status: str, reason: str | None = None,
               error: dict[str, Any] | None = None) -> list[Effect]:
        """End running response ``resp`` with ``status`` (completed, cancelled, failed): its closing events,
        then what its end brings (``on_finish``)."""
        if resp is self.active:
            self.active = None
        else:
            del self.out_of_band[resp.id]
        effects: list[Effect] = []
        if status != "completed":
            effects.append(StopResponse(resp.id))
        if self._server_playout and resp.audio_ms:
            effects.append(PlayoutEnd(resp.id))
        effects += self._close_message(resp, completed=status == "completed")
        for call in resp.outputs:
            if call.closed:
                continue
            if isinstance(call, McpCallOut) and call.running and status == "completed":
                effects += call.detach()  # it goes on; its result follows the response.done
            elif isinstance(call, McpCallOut):
                self.calls.pop(call.id, None)
                effects += call.finish(None, CANCELLED)
            elif isinstance(call, FunctionCallOut):
                effects += call.close(completed=False)
            # an approval request not yet sent is dropped: the client never saw it
        details: dict[str, Any] | None = None
        if status != "completed":
            details = {"type": status, "reason": reason, "error": error}
        effects.extend(self._event("response.done", response=self._wire(resp, status, details)))
        effects.append(Mark("response_done", resp.id))
        return effects + self._on_finish(resp)

    def _input(self, entries: tuple[str | dict[str, Any], ...]) -> list[Item]:
        """response.input's items: the conversation's it references, and new ones."""
        context = []
        for i, entry in enumerate(entries):
            if isinstance(entry, dict):
                context.append(Item(entry))
                continue
            item = self._conversation.get(entry)
            if item is None:
                raise ProtocolError("item_not_found", f"Item with id '{entry}' not found.", f"response.input[{i}].id")
            context.append(item)
        return context

    def _wire(self, resp: Response, status: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
        done = status != "in_progress"
        return {
            "id": resp.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": [snapshot(o.item.data) for o in resp.outputs if o.closed] if done else [],
            "conversation_id": self._conversation.id if resp.in_conversation else None,
            "output_modalities": resp.modalities,
            "max_output_tokens": resp.max_output_tokens,
            "metadata": resp.metadata,
            "audio": {"output": {"format": format_wire(resp.output_format), "voice": resp.voice}},
            "usage": resp.usage.wire(resp.audio_ms) if done else None,
        }
