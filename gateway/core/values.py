"""Reading client values: each field checked for its type and range, a ``ProtocolError`` naming it otherwise."""

from __future__ import annotations

from typing import Any

import orjson


class ProtocolError(Exception):
    """A client event the gateway refuses; becomes an ``error`` event and changes nothing."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


# Client JSON nested deeper is refused: echoed back (session.tools, response.metadata, ...) it could
# not be written (orjson writes at most 254 levels), and no Realtime event or REST body needs a tenth of it.
MAX_JSON_DEPTH = 32


def parse_json(text: str | bytes, what: str = "The message") -> Any:
    """JSON a client sent, by any way in (a WebSocket or data-channel message, an HTTP body, a form part);
    a ProtocolError (code invalid_json, ``what`` naming it) when it is not JSON or nests deeper than
    MAX_JSON_DEPTH."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError("invalid_json", f"{what} is not valid JSON: {exc}.") from None
    if _too_deep(value):
        raise ProtocolError("invalid_json", f"{what} is nested deeper than {MAX_JSON_DEPTH} levels.")
    return value


CONTAINERS = (dict, list)  # a tuple: `dict | list` would build a union at each test


def _too_deep(value: Any) -> bool:
    """Whether JSON ``value`` nests objects and arrays deeper than MAX_JSON_DEPTH (a scalar nests nothing)."""
    if isinstance(value, dict):
        for v in value.values():
            if isinstance(v, CONTAINERS):
                break
        else:
            return False  # a flat object, as most client events are (an audio append): no walk
    level: list[Any] = [value] if isinstance(value, CONTAINERS) else []
    for _ in range(MAX_JSON_DEPTH):
        level = [v for c in level for v in (c.values() if isinstance(c, dict) else c) if isinstance(v, CONTAINERS)]
        if not level:
            return False
    return True


def field_of(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], param: str, required: bool = False):
    """obj[key] checked against ``kind``; None when absent and not required."""
    if key not in obj or obj[key] is None:
        if required:
            raise ProtocolError("missing_required_parameter", f"Missing required parameter: '{param}'.", param)
        return None
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python; a JSON true is never a valid number here.
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds) or (float in kinds and isinstance(value, int))
    if not ok:
        names = " or ".join(k.__name__.replace("str", "string").replace("dict", "object") for k in kinds)
        raise ProtocolError(
            "invalid_type", f"Invalid type for '{param}': expected {names}, got {type(value).__name__}.", param
        )
    return value


def check_fields(obj: dict[str, Any], allowed: frozenset[str] | set[str], where: str = "") -> None:
    """Refuse a field ``obj`` may not have (``where``: the path of ``obj``, for ``param``), as OpenAI does: a
    field of another shape (a beta one sent in the GA shape) is a mistake to report, not a value to ignore."""
    for key in obj:
        if key not in allowed:
            param = f"{where}.{key}" if where else key
            raise ProtocolError("unknown_parameter", f"Unknown parameter: '{param[:200]}'.", param[:200])


def choice(value: Any, choices: tuple[str, ...], param: str) -> str:
    if value not in choices:
        raise ProtocolError(
            "invalid_value", f"Invalid value for '{param}': {value!r}; supported: {', '.join(choices)}.", param
        )
    return value


def non_empty(obj: dict[str, Any], key: str, param: str, required: bool = False) -> str | None:
    """A string field that, when present, must not be empty ("" is not taken as absent)."""
    value = field_of(obj, key, str, param, required)
    if value == "":
        raise ProtocolError("invalid_value", f"'{param}' must not be empty.", param)
    return value


def _dict_of_strings(value: dict[str, Any], param: str) -> None:
    for key, entry in value.items():
        if not isinstance(entry, str):
            raise ProtocolError("invalid_type", f"Invalid type for '{param}.{key}': expected string.", f"{param}.{key}")


MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


def parse_metadata(obj: dict[str, Any], key: str, param: str) -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 pairs of strings, keys up to 64 characters, values up to 512."""
    metadata = field_of(obj, key, dict, param)
    if metadata is None:
        return None
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ProtocolError("invalid_value", f"'{param}' may hold at most {MAX_METADATA_PAIRS} pairs.", param)
    _dict_of_strings(metadata, param)
    for name, value in metadata.items():
        if len(name) > MAX_METADATA_KEY_CHARS:
            raise ProtocolError("string_above_max_length", f"Keys of '{param}' are at most "
                                f"{MAX_METADATA_KEY_CHARS} characters long.", param)
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise ProtocolError("string_above_max_length", f"Values of '{param}' are at most "
                                f"{MAX_METADATA_VALUE_CHARS} characters long.", f"{param}.{name}")
    return metadata


def parse_prompt(obj: dict[str, Any], key: str, param: str) -> dict[str, Any] | None:
    """A stored-prompt reference {id, version?, variables?}; checked, not acted on (no stored prompts here)."""
    prompt = field_of(obj, key, dict, param)
    if prompt is None:
        return None
    non_empty(prompt, "id", f"{param}.id", required=True)
    field_of(prompt, "version", str, f"{param}.version")
    variables = field_of(prompt, "variables", dict, f"{param}.variables") or {}
    for name, value in variables.items():
        where = f"{param}.variables.{name}"
        if isinstance(value, str):
            continue
        part = field_of({"v": value}, "v", dict, where, required=True)
        kind = choice(field_of(part, "type", str, f"{where}.type", required=True),
                       ("input_text", "input_image", "input_file"), f"{where}.type")
        if kind == "input_text":
            field_of(part, "text", str, f"{where}.text", required=True)
    return prompt


def parse_reasoning(obj: dict[str, Any], key: str, param: str) -> dict[str, Any] | None:
    """{effort}: checked and reported back; the LLM backend's own settings decide how it reasons."""
    reasoning = field_of(obj, key, dict, param)
    if reasoning is not None and (effort := field_of(reasoning, "effort", str, f"{param}.effort")) is not None:
        choice(effort, ("minimal", "low", "medium", "high", "xhigh"), f"{param}.effort")
    return reasoning

