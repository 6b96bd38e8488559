"""The output items of a response and the events each one sends, from its ``added`` to its ``done``.

A response (gateway/realtime/responses.py) produces its items in order, each at its own ``output_index``: an
assistant message (speech or text), function calls (the client runs them), MCP calls (the gateway runs
them) and MCP approval requests (the client approves a call first). Each item here is opened, fed and
closed by the response; items of a response that joins the conversation are added to it as they open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pybase64

from gateway.audio import OutputEncoder
from gateway.realtime.conversation import BYTES_PER_MS, Conversation, EventMaker, Item, snapshot
from gateway.realtime.effects import Effect
from gateway.realtime.events import new_id
from gateway.realtime.tools import McpRoute


@dataclass(frozen=True)
class OutputScope:
    """What every output item of one response needs."""

    response_id: str
    event: EventMaker
    conversation: Conversation
    in_conversation: bool


class Output:
    """One output item; ``index`` is its output_index."""

    def __init__(self, scope: OutputScope, index: int, data: dict[str, Any]) -> None:
        self.scope = scope
        self.index = index
        self.item = Item(data, response_id=scope.response_id)
        self.closed = False

    @property
    def id(self) -> str:
        return self.item.id

    def _event(self, kind: str, **fields: Any) -> list[Effect]:
        return self.scope.event(kind, response_id=self.scope.response_id, item_id=self.id, output_index=self.index,
                              **fields)

    def _added(self, item: dict[str, Any]) -> list[Effect]:
        effects: list[Effect] = [*self.scope.event("response.output_item.added", response_id=self.scope.response_id,
                                                output_index=self.index, item=item)]
        if self.scope.in_conversation:
            conversation = self.scope.conversation
            effects += conversation.insert(self.item, done=False) + conversation.make_room(keep=self.item)
        return effects

    def _done(self) -> list[Effect]:
        return self._output_done() + self._conversation_done()

    def _output_done(self) -> list[Effect]:
        """The item is done as its response's output."""
        self.closed = True
        return [*self.scope.event("response.output_item.done", response_id=self.scope.response_id,
                                  output_index=self.index, item=snapshot(self.item.data))]

    def _conversation_done(self) -> list[Effect]:
        if not self.scope.in_conversation:
            return []
        conversation = self.scope.conversation
        conversation.recount(self.item)
        return conversation.done(self.item) + conversation.make_room(keep=self.item)


class MessageOut(Output):
    """The assistant's speech (audio and its transcript) or text."""

    def __init__(self, scope: OutputScope, index: int, item_id: str, audio: bool, encoder: OutputEncoder) -> None:
        part = {"type": "output_audio", "transcript": ""} if audio else {"type": "output_text", "text": ""}
        super().__init__(scope, index, {"id": item_id, "object": "realtime.item", "type": "message",
                                      "role": "assistant", "status": "in_progress", "content": [part]})
        self.audio = audio
        self.encoder = encoder
        self.transcript: list[str] = []

    def open(self) -> list[Effect]:
        effects = self._added({**snapshot(self.item.data), "content": []})
        return effects + self._event("response.content_part.added", content_index=0, part=self._part(""))

    def text(self, text: str) -> list[Effect]:
        if self.audio and not self.item.truncated:
            self.item.marks.append((len(self.item.audio), sum(map(len, self.transcript))))
        self.transcript.append(text)
        kind = "response.output_audio_transcript.delta" if self.audio else "response.output_text.delta"
        return self._event(kind, content_index=0, delta=text)

    def audio_delta(self, pcm: bytes) -> list[Effect]:
        encoded = self.encoder.encode(pcm)
        if not encoded:  # a G.711 resampler may hold all of a short chunk back
            return []
        return self._event("response.output_audio.delta", content_index=0, delta=pybase64.b64encode_as_string(encoded))

    def close(self, completed: bool, flush: bool) -> list[Effect]:
        """``flush``: send the encoder's held-back tail (a completed message heard by the client itself)."""
        text = "".join(self.transcript)
        data = self.item.data
        data["status"] = "completed" if completed else "incomplete"
        if not self.item.truncated:  # a truncated item keeps what was heard
            data["content"][0]["transcript" if self.audio else "text"] = text
        effects: list[Effect] = []
        tail = self.encoder.flush() if flush else b""
        if tail:
            effects.extend(self._event("response.output_audio.delta", content_index=0,
                                       delta=pybase64.b64encode_as_string(tail)))
        if self.audio:
            effects.extend(self._event("response.output_audio.done", content_index=0))
            effects.extend(self._event("response.output_audio_transcript.done", content_index=0, transcript=text))
        else:
            effects.extend(self._event("response.output_text.done", content_index=0, text=text))
        effects.extend(self._event("response.content_part.done", content_index=0, part=self._part(text)))
        return effects + self._done()

    def sync_transcript(self) -> None:
        if self.audio and not self.item.truncated:
            self.item.data["content"][0]["transcript"] = "".join(self.transcript)

    def _part(self, text: str) -> dict[str, Any]:
        return {"type": "audio", "transcript": text} if self.audio else {"type": "text", "text": text}

    @property
    def audio_ms(self) -> float:
        return len(self.item.audio) / BYTES_PER_MS


class FunctionCallOut(Output):
    """A call of a function tool: the client runs it and answers with a function_call_output item."""

    def __init__(self, scope: OutputScope, index: int, call_id: str, name: str) -> None:
        super().__init__(scope, index, {"id": new_id("item"), "object": "realtime.item", "type": "function_call",
                                      "status": "in_progress", "call_id": call_id, "name": name, "arguments": ""})

    def open(self) -> list[Effect]:
        return self._added(snapshot(self.item.data))

    def arguments(self, delta: str) -> list[Effect]:
        self.item.data["arguments"] += delta
        return self._event("response.function_call_arguments.delta", call_id=self.item.data["call_id"],
                            delta=delta)

    def close(self, completed: bool) -> list[Effect]:
        data = self.item.data
        data["status"] = "completed" if completed else "incomplete"
        return [*self._event("response.function_call_arguments.done", call_id=data["call_id"], name=data["name"],
                            arguments=data["arguments"]), *self._done()]


@dataclass(frozen=True)
class McpError:
    """Why an MCP call failed, as the mcp_call item's ``error`` has it."""

    type: str  # protocol_error | tool_execution_error | http_error
    message: str
    code: int | None = None  # protocol_error: the JSON-RPC code; http_error: the HTTP status

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.type != "tool_execution_error":
            out["code"] = self.code
        return out


class McpCallOut(Output):
    """A call of an MCP server's tool, run by the gateway: its arguments stream in, then it runs (the
    runner's CallMcp), and its output or error closes it. A call still running when its response ends
    (``detach``, OpenAI's order) finishes after the response.done: its result is then told by
    response.mcp_call.completed (or .failed) and conversation.item.done."""

    def __init__(self, scope: OutputScope, index: int, route: McpRoute, arguments: str = "",
                 approval_request_id: str | None = None) -> None:
        super().__init__(scope, index, {"id": new_id("mcp"), "type": "mcp_call",
                                      "server_label": route.server.server_label, "name": route.tool.name,
                                      "arguments": arguments, "approval_request_id": approval_request_id,
                                      "output": None, "error": None})
        self.route = route
        self.running = False

    def open(self) -> list[Effect]:
        return self._added(snapshot(self.item.data))

    def arguments(self, delta: str) -> list[Effect]:
        self.item.data["arguments"] += delta
        # obfuscation (OpenAI's padding of streamed deltas) is required by the JS Agents SDK: none here.
        return self._event("response.mcp_call_arguments.delta", delta=delta, obfuscation="")

    def start(self, streamed: bool) -> list[Effect]:
        """The arguments are complete (``streamed``: they came as deltas): the call runs."""
        self.running = True
        effects: list[Effect] = []
        if streamed:
            effects.extend(self._event("response.mcp_call_arguments.done", arguments=self.item.data["arguments"]))
        return effects + self.scope.event("response.mcp_call.in_progress", item_id=self.id, output_index=self.index)

    def detach(self) -> list[Effect]:
        """Its response ends while it runs: the item is done as the response's output, without a result yet."""
        return self._output_done()

    def finish(self, output: str | None, error: McpError | None) -> list[Effect]:
        self.running = False
        self.item.data["output"] = output
        self.item.data["error"] = error.wire() if error is not None else None
        kind = "response.mcp_call.failed" if error is not None else "response.mcp_call.completed"
        effects = self.scope.event(kind, item_id=self.id, output_index=self.index)
        return effects + (self._conversation_done() if self.closed else self._done())


class McpApprovalOut(Output):
    """A call of an MCP tool that needs the client's approval: an mcp_approval_request item, sent whole once
    the LLM has given all its arguments; the call runs in the next response if the client approves."""

    def __init__(self, scope: OutputScope, index: int, route: McpRoute) -> None:
        super().__init__(scope, index, {"id": new_id("mcpr"), "type": "mcp_approval_request",
                                      "server_label": route.server.server_label, "name": route.tool.name,
                                      "arguments": ""})

    def open(self) -> list[Effect]:
        return []

    def arguments(self, delta: str) -> list[Effect]:
        self.item.data["arguments"] += delta
        return []

    def close(self, completed: bool) -> list[Effect]:
        return self._added(snapshot(self.item.data)) + self._done()


@dataclass
class Usage:
    """A response's token counts: the LLM's (summed over its rounds), and its audio at OpenAI's published
    rates (user audio 1 token per 100 ms, assistant audio 1 per 50 ms) since the protocol counts only tokens."""

    text_in: int | None = None  # None: the LLM server reported none
    text_out: int | None = None
    cached: int | None = None
    audio_in: int = 0

    def add(self, input_tokens: int, output_tokens: int, cached: int | None) -> None:
        self.text_in = (self.text_in or 0) + input_tokens
        self.text_out = (self.text_out or 0) + output_tokens
        if cached is not None:
            self.cached = (self.cached or 0) + cached

    def wire(self, audio_out_ms: float) -> dict[str, Any]:
        audio_out = round(audio_out_ms / 50)
        inputs = (self.text_in or 0) + self.audio_in
        outputs = (self.text_out or 0) + audio_out
        details_in: dict[str, int] = {"audio_tokens": self.audio_in, "cached_tokens": self.cached or 0}
        details_out: dict[str, int] = {"audio_tokens": audio_out}
        # Text counts only when the LLM server reported them (some send no usage): absent, not guessed.
        if self.text_in is not None:
            details_in["text_tokens"] = self.text_in
        if self.text_out is not None:
            details_out["text_tokens"] = self.text_out
        return {"total_tokens": inputs + outputs, "input_tokens": inputs, "output_tokens": outputs,
                "input_token_details": details_in, "output_token_details": details_out}


@dataclass
class Round:
    """What the LLM call of a response produced: its tool calls by the LLM's index."""

    calls: dict[int, FunctionCallOut | McpCallOut | McpApprovalOut] = field(default_factory=dict)
