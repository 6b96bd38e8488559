"""response.create's ``response``, read and checked in one place for both dialects.

``parse_response`` checks the whole body against the session's settings and returns what the response will
be (``ResponseParams``, a value), before anything changes; gateway/realtime/responses.py then starts it. The
dialects differ only in where they keep a field (``FIELDS``) and in two fields one of them has.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from gateway.core.values import check_fields, field_of, non_empty, parse_metadata, parse_prompt, parse_reasoning
from gateway.realtime.events import Dialect, ProtocolError
from gateway.realtime.items import parse_item
from gateway.realtime.settings import SessionSettings, check_voice, parse_temperature, response_format
from gateway.realtime.tools import McpPolicy, Tool, parse_tool_choice, parse_tools


@dataclass(frozen=True, slots=True)
class ResponseFields:
    """Where a dialect keeps response.create's fields (their names are the params its errors name)."""

    modalities: str
    output: tuple[str, ...]  # the objects, from the body down, that hold the voice
    voice: type | tuple[type, ...]  # GA also takes {"id": ...}
    max_tokens: str
    temperature: bool  # a response may set its own temperature (beta)
    prompt_and_reasoning: bool  # checked, not acted on (GA): no stored prompts; the LLM's settings decide reasoning
    # The fields each object has (by its param), OpenAI's: any other is refused, as OpenAI refuses it.
    names: dict[str, frozenset[str]]


FIELDS = {
    Dialect.GA: ResponseFields("output_modalities", ("audio", "output"), (str, dict), "max_output_tokens",
                               temperature=False, prompt_and_reasoning=True, names={
                                   "response": frozenset({
                                       "audio", "conversation", "input", "instructions", "max_output_tokens",
                                       "metadata", "output_modalities", "parallel_tool_calls", "prompt",
                                       "reasoning", "tool_choice", "tools"}),
                                   "response.audio": frozenset({"output"}),
                                   "response.audio.output": frozenset({"format", "voice"})}),
    Dialect.BETA: ResponseFields("modalities", (), str, "max_response_output_tokens",
                                 temperature=True, prompt_and_reasoning=False, names={
                                     "response": frozenset({
                                         "conversation", "input", "instructions", "max_response_output_tokens",
                                         "metadata", "modalities", "output_audio_format", "temperature",
                                         "tool_choice", "tools", "voice"})}),
}


@dataclass(frozen=True, slots=True)
class ResponseParams:
    """What a response will be: the body's values, the session's where it set none."""

    modalities: list[str]
    voice: str
    output_format: str
    in_conversation: bool
    max_output_tokens: int | str
    metadata: dict[str, str] | None
    instructions: str
    temperature: float | None  # None: the backend's own
    tools: list[Tool]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool | None
    # response.input, the context it sees instead of the conversation: item ids to look up and new items' data.
    input: tuple[str | dict[str, Any], ...] | None


def parse_response(body: dict[str, Any], settings: SessionSettings, dialect: Dialect,
                   voices: Collection[str] | None, policy: McpPolicy) -> ResponseParams:
    """``body`` (response.create's ``response``, {} for a turn's own response) checked; ProtocolError naming
    the first field that is wrong."""
    s, fields = settings, FIELDS[dialect]
    check_fields(body, fields.names["response"], "response")
    mods_param = f"response.{fields.modalities}"
    mods = field_of(body, fields.modalities, list, mods_param)
    out, where = body, "response"
    for key in fields.output:
        where = f"{where}.{key}"
        out = field_of(out, key, dict, where) or {}
        check_fields(out, fields.names[where], where)
    voice = _voice(out, f"{where}.voice", fields, voices)
    if mods is not None:
        for i, m in enumerate(mods):
            if m not in ("text", "audio"):
                raise ProtocolError("invalid_value", f"Invalid modality {m!r}.", f"{mods_param}[{i}]")
        if not mods:
            raise ProtocolError("invalid_value", f"'{mods_param}' must not be empty.", mods_param)
    max_tokens = body.get(fields.max_tokens)
    if max_tokens is not None and max_tokens != "inf" and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 4096
    ):
        raise ProtocolError("invalid_value", "max output tokens must be 1..4096 or \"inf\".",
                            f"response.{fields.max_tokens}")
    conversation = field_of(body, "conversation", str, "response.conversation")
    if conversation not in (None, "auto", "none"):
        raise ProtocolError("invalid_value", "'response.conversation' must be 'auto' or 'none'.",
                            "response.conversation")
    instructions = field_of(body, "instructions", str, "response.instructions")
    metadata = parse_metadata(body, "metadata", "response.metadata")
    if fields.prompt_and_reasoning:
        parse_prompt(body, "prompt", "response.prompt")
        parse_reasoning(body, "reasoning", "response.reasoning")
    temperature = parse_temperature(body, "response.temperature") if fields.temperature else None
    output_format = response_format(body, dialect)
    tools = s.tools
    if body.get("tools") is not None:
        tools = parse_tools(body["tools"], "response.tools", dialect, policy)
    parallel = s.parallel_tool_calls
    if fields.prompt_and_reasoning and body.get("parallel_tool_calls") is not None:  # GA's, as the session's
        parallel = field_of(body, "parallel_tool_calls", bool, "response.parallel_tool_calls")
    tool_choice = s.tool_choice
    if body.get("tool_choice") is not None:
        tool_choice = parse_tool_choice(body["tool_choice"], tools, "response.tool_choice", dialect)
    elif tools is not s.tools and isinstance(tool_choice, dict):
        tool_choice = "auto"  # the session's named tool is not among this response's tools
    return ResponseParams(
        modalities=(["audio"] if "audio" in mods else ["text"]) if mods else s.modalities,
        voice=voice or s.voice,
        output_format=output_format or s.output_format,
        in_conversation=conversation != "none",
        max_output_tokens=max_tokens if max_tokens is not None else s.max_output_tokens,
        metadata=metadata,
        instructions=instructions if instructions is not None else s.instructions,
        temperature=s.temperature if temperature is None else temperature,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        input=_input(body["input"]) if body.get("input") is not None else None,
    )


def _voice(out: dict[str, Any], param: str, fields: ResponseFields, voices: Collection[str] | None) -> str | None:
    voice = field_of(out, "voice", fields.voice, param)
    if isinstance(voice, dict):
        voice = non_empty(voice, "id", f"{param}.id", required=True)
    if voice is not None:
        non_empty({"v": voice}, "v", param)
        check_voice(voice, voices, param)
    return voice


def _input(value: Any) -> tuple[str | dict[str, Any], ...]:
    """response.input: references to conversation items (their ids) and new items (their data)."""
    entries = field_of({"input": value}, "input", list, "response.input")
    context: list[str | dict[str, Any]] = []
    for i, entry in enumerate(entries):
        param = f"response.input[{i}]"
        body = field_of({"e": entry}, "e", dict, param, required=True)
        if body.get("type") == "item_reference":
            context.append(field_of(body, "id", str, f"{param}.id", required=True))
            continue
        data = parse_item(body, param)
        for j, part in enumerate(data.get("content", [])):
            if part.pop("audio", None):
                raise ProtocolError("unsupported_content", "Audio in response.input is not supported; "
                                    "create the item first and reference it.", f"{param}.content[{j}]")
        context.append(data)
    return tuple(context)
