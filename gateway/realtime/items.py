"""Conversation items a client creates (conversation.item.create), read into their GA shape."""

from __future__ import annotations

import re
from typing import Any

from gateway.core.values import choice, field_of, non_empty
from gateway.realtime.events import ProtocolError, new_id

# Content part types: GA assistant parts are output_*, beta's are bare.
GA_PART_TYPES = {"audio": "output_audio", "text": "output_text"}
IMAGE_KINDS = ("data:image/png;base64", "data:image/jpeg;base64", "data:image/jpg;base64")
BASE64 = re.compile(r"[A-Za-z0-9+/=\s]+")


def parse_item(body: Any, param: str = "item") -> dict[str, Any]:
    """A client-created item, checked, in GA shape (beta part types renamed)."""
    item = field_of({"item": body}, "item", dict, param, required=True)
    kind = choice(field_of(item, "type", str, f"{param}.type", required=True),
                   ("message", "function_call", "function_call_output", "mcp_approval_response"), f"{param}.type")
    out: dict[str, Any] = {"id": non_empty(item, "id", f"{param}.id") or new_id("item"),
                           "object": "realtime.item", "type": kind, "status": "completed"}
    if kind == "message":
        role = choice(field_of(item, "role", str, f"{param}.role", required=True),
                       ("user", "assistant", "system"), f"{param}.role")
        allowed = {
            "user": ("input_text", "input_audio", "input_image"),
            "system": ("input_text",),
            "assistant": ("output_text", "output_audio"),
        }[role]
        parts = []
        for i, raw in enumerate(field_of(item, "content", list, f"{param}.content", required=True)):
            p = field_of({"p": raw}, "p", dict, f"{param}.content[{i}]", required=True)
            ptype = field_of(p, "type", str, f"{param}.content[{i}].type", required=True)
            ptype = GA_PART_TYPES.get(ptype, ptype) if role == "assistant" else ptype
            choice(ptype, allowed, f"{param}.content[{i}].type")
            part: dict[str, Any] = {"type": ptype}
            if ptype in ("input_text", "output_text"):
                part["text"] = field_of(p, "text", str, f"{param}.content[{i}].text", required=True)
            elif ptype == "input_image":
                part["image_url"] = image_url(p, f"{param}.content[{i}]")
                part["detail"] = choice(field_of(p, "detail", str, f"{param}.content[{i}].detail") or "auto",
                                        ("auto", "low", "high"), f"{param}.content[{i}].detail")
            else:
                part["audio"] = field_of(p, "audio", str, f"{param}.content[{i}].audio")
                part["transcript"] = field_of(p, "transcript", str, f"{param}.content[{i}].transcript")
            parts.append(part)
        out.update(role=role, content=parts)
    elif kind == "function_call":
        out.update(
            call_id=non_empty(item, "call_id", f"{param}.call_id") or new_id("call"),
            name=non_empty(item, "name", f"{param}.name", required=True),
            arguments=field_of(item, "arguments", str, f"{param}.arguments") or "",
        )
    elif kind == "function_call_output":
        out.update(
            call_id=non_empty(item, "call_id", f"{param}.call_id", required=True),
            output=field_of(item, "output", str, f"{param}.output", required=True),
        )
    else:  # the client's answer to an mcp_approval_request (GA only: the session checks the dialect)
        del out["object"], out["status"]  # not fields of this item type
        out.update(
            approval_request_id=non_empty(item, "approval_request_id", f"{param}.approval_request_id",
                                          required=True),
            approve=field_of(item, "approve", bool, f"{param}.approve", required=True),
            reason=field_of(item, "reason", str, f"{param}.reason"),
        )
    return out



def image_url(part: dict[str, Any], param: str) -> str:
    """An input_image's picture: a PNG or JPEG as a base64 data URL, as OpenAI takes it."""
    url = field_of(part, "image_url", str, f"{param}.image_url", required=True)
    kind, comma, data = url.partition(",")
    if not comma or kind.lower() not in IMAGE_KINDS or not BASE64.fullmatch(data[:4096]):
        raise ProtocolError("invalid_value", "An input_image's image_url must be a PNG or JPEG as a base64 data URL "
                            "(data:image/png;base64,...).", f"{param}.image_url")
    return url
