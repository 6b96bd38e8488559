"""A session's conversation: its items in order, their audio, and what the listener heard of each.

Items are kept GA-shaped with their audio payloads apart (as pcm16 24 kHz), so events never carry
audio unless asked (conversation.item.retrieve). The conversation builds the item events itself;
deciding when items are added (turns, responses, clients) is the session's business.

What it holds is bounded ([session] max_items, max_audio_seconds, max_text_bytes). An item a client
creates that does not fit is refused (``check_room``); items the session makes itself (committed
turns, responses, transcripts) make room by dropping the oldest items (``make_room``), each with a
conversation.item.deleted, so a long session goes on within the same memory.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.audio import InputDecoder, OutputEncoder
from gateway.config import SessionConfig
from gateway.core.responder import Message, ToolCall
from gateway.core.values import non_empty
from gateway.realtime.effects import Effect
from gateway.realtime.events import ProtocolError, new_id
from gateway.realtime.items import parse_item

BYTES_PER_MS = 48  # pcm16 mono at 24 kHz, the session's internal format

# Makes a server event of a type and its fields: the effects that send it (none where the client's dialect has no
# such event).
EventMaker = Callable[..., list[Effect]]


@dataclass
class Item:
    """A conversation item: its GA-shaped data (audio payloads left out) and its audio."""

    data: dict[str, Any]
    audio: bytearray = field(default_factory=bytearray)
    # (audio bytes, transcript chars) at each SpeechText: which text the audio after it speaks.
    marks: list[tuple[int, int]] = field(default_factory=list)
    response_id: str | None = None
    # Truncated: the listener stopped hearing it. Audio its still-running response adds is sent, not kept.
    truncated: bool = False
    text_bytes: int = 0  # its text as the conversation counted it

    @property
    def id(self) -> str:
        return self.data["id"]


def text_size(data: dict[str, Any]) -> int:
    """UTF-8 bytes of an item's text: texts, transcripts, pictures' data URLs, a function call's name,
    arguments and output, the tools an MCP server listed (as JSON)."""
    texts = [data.get(k) for k in ("name", "arguments", "output")]
    texts += [p.get(k) for p in data.get("content", ()) for k in ("text", "transcript", "image_url")]
    listed = len(orjson.dumps(data["tools"])) if data.get("type") == "mcp_list_tools" else 0
    return listed + sum(len(t.encode()) for t in texts if isinstance(t, str))


def snapshot(item: dict[str, Any]) -> dict[str, Any]:
    """A copy of an item for an event: the stored item changes later (status, transcript)."""
    if "content" not in item:
        return dict(item)
    return {**item, "content": [dict(p) for p in item["content"]]}


def item_from_client(body: Any, input_format: str, max_audio_bytes: int, param: str = "item") -> Item:
    """A client's item (conversation.item.create), checked; its audio (at most ``max_audio_bytes``
    decoded, as an append) decoded."""
    data = parse_item(body, param)
    item = Item(data)
    encoded = [(i, p["audio"]) for i, p in enumerate(data.get("content", [])) if p.get("audio")]
    if sum(len(a) for _, a in encoded) // 4 * 3 > max_audio_bytes:
        raise ProtocolError("audio_too_large", f"An item may carry at most {max_audio_bytes} bytes of audio "
                            "([session] max_append_bytes).", f"{param}.content[{encoded[-1][0]}].audio")
    for i, part in enumerate(data.get("content", [])):
        if part["type"] == "input_audio" and part.get("audio"):
            try:
                raw = base64.b64decode(part.pop("audio"), validate=True)
            except (binascii.Error, ValueError):
                where = f"{param}.content[{i}].audio"
                raise ProtocolError("invalid_base64", "Audio is not valid base64.", where) from None
            decoder = InputDecoder(input_format)
            item.audio += decoder.decode(raw) + decoder.flush()
        part.pop("audio", None)
    return item


class Conversation:
    def __init__(self, event: EventMaker, limits: SessionConfig) -> None:
        self.id = new_id("conv")
        self._event = event
        self._items: dict[str, Item] = {}
        self._order: list[str] = []
        self.max_items = limits.max_items
        self.max_audio_bytes = int(limits.max_audio_seconds * 1000) * BYTES_PER_MS
        self.max_text_bytes = limits.max_text_bytes
        self.audio_bytes = 0
        self.text_bytes = 0
        self.reserved_text_bytes = 0  # the session's configuration (instructions, tools, ...) as JSON

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._items

    def get(self, item_id: str) -> Item | None:
        return self._items.get(item_id)

    def find(self, event: dict[str, Any], verb: str) -> Item:
        """The item a client event names in ``item_id``, to ``verb`` (retrieve, delete, truncate); an
        error with OpenAI's code for that event if there is none (clients match on it)."""
        item_id = non_empty(event, "item_id", "item_id", required=True)
        item = self._items.get(item_id)
        if item is None:
            doing = {"retrieve": "retrieving", "delete": "deleting", "truncate": "truncating"}[verb]
            raise ProtocolError(f"item_{verb}_invalid_item_id",
                                f"Error {doing} item: the item with id '{item_id}' does not exist.", "item_id")
        return item

    @property
    def last_id(self) -> str | None:
        return self._order[-1] if self._order else None

    def previous(self, item_id: str) -> str | None:
        index = self._order.index(item_id)
        return self._order[index - 1] if index > 0 else None

    def index_after(self, previous: str | None) -> int:
        """Where an item goes after ``previous``: "root" is the start, None the end."""
        if previous == "root":
            return 0
        return self._order.index(previous) + 1 if previous else len(self._order)

    def insert(self, item: Item, index: int | None = None, done: bool = True) -> list[Effect]:
        """Add ``item`` at ``index`` (default: the end): conversation.item.added, and .done unless it is
        still being produced."""
        index = len(self._order) if index is None else index
        self._items[item.id] = item
        self._order.insert(index, item.id)
        item.text_bytes = text_size(item.data)
        self.audio_bytes += len(item.audio)
        self.text_bytes += item.text_bytes
        previous = self._order[index - 1] if index > 0 else None
        kinds = ["conversation.item.added", "conversation.item.done"] if done else ["conversation.item.added"]
        return [e for kind in kinds for e in self._event(kind, item=snapshot(item.data), previous_item_id=previous)]

    def done(self, item: Item) -> list[Effect]:
        """conversation.item.done for an item produced in place (a response's), if it is still here."""
        if item.id not in self._items:
            return []
        previous = self.previous(item.id)
        return self._event("conversation.item.done", item=snapshot(item.data), previous_item_id=previous)

    def delete(self, item_id: str) -> list[Effect]:
        item = self._items.pop(item_id)
        self._order.remove(item_id)
        self.audio_bytes -= len(item.audio)
        self.text_bytes -= item.text_bytes
        return self._event("conversation.item.deleted", item_id=item_id)

    # --- what it holds ------------------------------------------------------------------------------

    def check_room(self, item: Item) -> None:
        """Refuse a client's ``item`` that would take the conversation past a limit."""
        problem = self._over(1, len(item.audio), text_size(item.data))
        if problem is not None:
            raise ProtocolError("conversation_full", f"The conversation is full: {problem}. Delete items "
                                "(conversation.item.delete) to make room.", "item")

    def reserve_text(self, nbytes: int, param: str) -> None:
        """The session's configuration takes ``nbytes`` of the text budget (refused if it does not fit)."""
        if self.text_bytes + nbytes > self.max_text_bytes:
            raise ProtocolError(
                "session_too_large", f"The session's configuration ({nbytes} bytes as JSON) and the "
                f"conversation's text ({self.text_bytes} bytes) exceed [session] max_text_bytes "
                f"({self.max_text_bytes}).", param)
        self.reserved_text_bytes = nbytes

    def make_room(self, keep: Item | None = None) -> list[Effect]:
        """Drop the oldest items (never ``keep``) until the conversation is within its limits again."""
        effects: list[Effect] = []
        for item_id in list(self._order):
            if self._over() is None:
                break
            if keep is None or item_id != keep.id:
                effects += self.delete(item_id)
        return effects

    def add_audio(self, item: Item, pcm: bytes) -> None:
        item.audio += pcm
        if item.id in self._items:
            self.audio_bytes += len(pcm)

    def recount(self, item: Item) -> None:
        """The item's text changed: count it anew."""
        size = text_size(item.data)
        if item.id in self._items:
            self.text_bytes += size - item.text_bytes
        item.text_bytes = size

    def _over(self, items: int = 0, audio: int = 0, text: int = 0) -> str | None:
        """Which limit the conversation (with that much more) is past, in words; None if none."""
        if len(self._order) + items > self.max_items:
            return f"at most {self.max_items} items ([session] max_items)"
        if self.audio_bytes + audio > self.max_audio_bytes:
            return f"at most {self.max_audio_bytes // 48000} s of audio ([session] max_audio_seconds)"
        if self.text_bytes + self.reserved_text_bytes + text > self.max_text_bytes:
            return f"at most {self.max_text_bytes} bytes of text ([session] max_text_bytes)"
        return None

    def retrieved(self, item: Item, input_format: str, output_format: str) -> list[Effect]:
        """The item with its audio, in the session's formats (the client's input one for what it sent, the
        output one for what it heard): a G.711 client reads it as it reads its deltas."""
        data = snapshot(item.data)
        for part in data.get("content", []):
            if part["type"] in ("input_audio", "output_audio"):
                encoder = OutputEncoder(input_format if part["type"] == "input_audio" else output_format)
                part["audio"] = base64.b64encode(encoder.encode(bytes(item.audio)) + encoder.flush()).decode()
        return self._event("conversation.item.retrieved", item=data)

    def truncate(self, item: Item, content_index: int, end_ms: int) -> list[Effect]:
        """Keep what was heard: the first ``end_ms`` of the audio and the words it speaks."""
        cut = min(len(item.audio), end_ms * BYTES_PER_MS)
        # A client counts whole ms of what it got: a cut within the last ms heard all of it.
        heard = len(item.audio) if len(item.audio) - cut < BYTES_PER_MS else cut
        part = item.data["content"][content_index]
        part["transcript"] = heard_text(part.get("transcript") or "", item.marks, len(item.audio), heard)
        if item.id in self._items:
            self.audio_bytes -= len(item.audio) - cut
        del item.audio[cut:]
        item.marks = [m for m in item.marks if m[0] < cut]
        item.truncated = True
        self.recount(item)
        return self._event("conversation.item.truncated", item_id=item.id, content_index=content_index,
                            audio_end_ms=end_ms)

    def set_transcript(self, item: Item, text: str) -> list[Effect]:
        for part in item.data.get("content", []):
            if part["type"] == "input_audio":
                part["transcript"] = text
        self.recount(item)
        return self.make_room(keep=item)

    def items(self) -> list[Item]:
        return [self._items[i] for i in self._order]

    def messages(self, items: list[Item] | None = None) -> list[Message]:
        """The conversation as the responder sees it (or ``items``, a response's own context).

        A tool call is seen only once it has a result, and in the assistant message it follows, with that
        result: a function call's output, an MCP call's output or error, or the client's refusal of an MCP
        call it was asked to approve. (An MCP call made after an approval is the result of that request.)
        """
        items = self.items() if items is None else items
        results = tool_results(items)
        messages: list[Message] = []
        for item in items:
            data = item.data
            kind = data["type"]
            if kind == "message":
                texts = []
                for part in data["content"]:
                    value = part.get("text") if "text" in part["type"] else part.get("transcript")
                    if value:
                        texts.append(value)
                messages.append(Message(
                    item_id=item.id,
                    role=data["role"],
                    text=" ".join(texts) or None,
                    audio=bytes(item.audio) if data["role"] == "user" and item.audio else None,
                    images=[(p["image_url"], p["detail"]) for p in data["content"] if p["type"] == "input_image"],
                ))
                continue
            call_id = {"function_call": data.get("call_id"), "mcp_approval_request": item.id,
                       "mcp_call": None if data.get("approval_request_id") else item.id}.get(kind)
            if call_id is None or call_id not in results:
                continue
            call = ToolCall(call_id, data["name"], data["arguments"], results[call_id])
            if messages and messages[-1].role == "assistant":
                messages[-1].tool_calls.append(call)
            else:
                messages.append(Message(item_id=item.id, role="assistant", tool_calls=[call]))
        return messages


def tool_results(items: list[Item]) -> dict[str, str]:
    """The result of each tool call among ``items`` that has one, by call id (see Conversation.messages)."""
    results: dict[str, str] = {}
    for item in items:
        data = item.data
        if data["type"] == "function_call_output":
            results[data["call_id"]] = data["output"]
        elif data["type"] == "mcp_call" and (data.get("output") is not None or data.get("error")):
            output = data["output"] if data.get("output") is not None else f"Error: {data['error']['message']}"
            results[data.get("approval_request_id") or item.id] = output
        elif data["type"] == "mcp_approval_response" and not data["approve"]:
            reason = f" ({data['reason']})" if data.get("reason") else ""
            results.setdefault(data["approval_request_id"], f"The user did not approve this call{reason}.")
    return results


def heard_text(text: str, marks: list[tuple[int, int]], audio_len: int, cut: int) -> str:
    """The part of ``text`` spoken by the first ``cut`` bytes of audio, whole words only.

    Each mark says the audio from its byte offset on speaks the text from its char offset on, up to
    the next mark; within a stretch, the share of the text heard is the share of the audio heard.
    """
    if not marks:
        return text if cut >= audio_len else ""
    heard = 0
    for i, (audio_at, text_at) in enumerate(marks):
        audio_end = marks[i + 1][0] if i + 1 < len(marks) else audio_len
        text_end = marks[i + 1][1] if i + 1 < len(marks) else len(text)
        if cut >= audio_end and audio_end > audio_at:
            heard = text_end
        elif cut > audio_at:
            share = (cut - audio_at) / (audio_end - audio_at)
            piece = text[text_at:text_end]
            n = int(len(piece) * share)
            if " " in piece[:n] and n < len(piece) and not piece[n].isspace():
                n = piece.rindex(" ", 0, n)
            heard = text_at + n
            break
        else:
            break
    return text[:heard].rstrip()
