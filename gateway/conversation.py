"""A session's conversation: its items in order, their audio, and what the listener heard of each.

Items are kept GA-shaped with their audio payloads apart (as pcm16 24 kHz), so events never carry
audio unless asked (conversation.item.retrieve). The conversation builds the item events itself;
deciding when items are added (turns, responses, clients) is the session's business.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.audio import InputDecoder
from gateway.effects import Effect
from gateway.protocol import ProtocolError, field_of, new_id, parse_item
from gateway.responder import Message

BYTES_PER_MS = 48  # pcm16 mono at 24 kHz, the session's internal format

EventMaker = Callable[..., dict[str, Any]]


@dataclass
class Item:
    """A conversation item: its GA-shaped data (audio payloads left out) and its audio."""

    data: dict[str, Any]
    audio: bytearray = field(default_factory=bytearray)
    # (audio bytes, transcript chars) at each SpeechText: which text the audio after it speaks.
    marks: list[tuple[int, int]] = field(default_factory=list)
    response_id: str | None = None

    @property
    def id(self) -> str:
        return self.data["id"]


def snapshot(item: dict[str, Any]) -> dict[str, Any]:
    """A copy of an item for an event: the stored item changes later (status, transcript)."""
    if "content" not in item:
        return dict(item)
    return {**item, "content": [dict(p) for p in item["content"]]}


def item_from_client(body: Any, input_format: str, param: str = "item") -> Item:
    """A client's item (conversation.item.create, response.input), checked; its audio decoded."""
    data = parse_item(body, param)
    item = Item(data)
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
    def __init__(self, event: EventMaker) -> None:
        self.id = new_id("conv")
        self._event = event
        self._items: dict[str, Item] = {}
        self._order: list[str] = []

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._items

    def get(self, item_id: str) -> Item | None:
        return self._items.get(item_id)

    def find(self, event: dict[str, Any]) -> Item:
        """The item a client event names in ``item_id``; item_not_found if there is none."""
        item_id = field_of(event, "item_id", str, "item_id", required=True)
        item = self._items.get(item_id)
        if item is None:
            raise ProtocolError("item_not_found", f"Item with id '{item_id}' not found.", "item_id")
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
        previous = self._order[index - 1] if index > 0 else None
        kinds = ["conversation.item.added", "conversation.item.done"] if done else ["conversation.item.added"]
        return [self._event(kind, item=snapshot(item.data), previous_item_id=previous) for kind in kinds]

    def done(self, item: Item) -> list[Effect]:
        """conversation.item.done for an item produced in place (a response's), if it is still here."""
        if item.id not in self._items:
            return []
        previous = self.previous(item.id)
        return [self._event("conversation.item.done", item=snapshot(item.data), previous_item_id=previous)]

    def delete(self, item_id: str) -> list[Effect]:
        del self._items[item_id]
        self._order.remove(item_id)
        return [self._event("conversation.item.deleted", item_id=item_id)]

    def retrieved(self, item: Item) -> list[Effect]:
        data = snapshot(item.data)
        for part in data.get("content", []):
            if part["type"] in ("input_audio", "output_audio"):
                part["audio"] = base64.b64encode(item.audio).decode()
        return [self._event("conversation.item.retrieved", item=data)]

    def truncate(self, item: Item, content_index: int, end_ms: int) -> list[Effect]:
        """Keep what was heard: the first ``end_ms`` of the audio and the words it speaks."""
        cut = min(len(item.audio), end_ms * BYTES_PER_MS)
        part = item.data["content"][content_index]
        part["transcript"] = heard_text(part.get("transcript") or "", item.marks, len(item.audio), cut)
        del item.audio[cut:]
        item.marks = [m for m in item.marks if m[0] < cut]
        return [self._event("conversation.item.truncated", item_id=item.id, content_index=content_index,
                            audio_end_ms=end_ms)]

    def set_transcript(self, item: Item, text: str) -> None:
        for part in item.data.get("content", []):
            if part["type"] == "input_audio":
                part["transcript"] = text

    def items(self) -> list[Item]:
        return [self._items[i] for i in self._order]

    def messages(self, context: list[Item] | None = None) -> list[Message]:
        """The conversation as the responder sees it (or ``context``, a response's own input)."""
        messages = []
        for item in context if context is not None else self.items():
            data = item.data
            if data["type"] != "message":
                continue
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
            ))
        return messages


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
