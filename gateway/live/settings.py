"""A Live session's configuration: ``session.start`` (or a WebRTC create's ``session``) read strictly and resolved,
``session.update``'s delegation patches, and the resource that session.started/.updated/.closed echo.

Only ``delegation.responses`` changes after the start; everything else is fixed. Unknown fields are refused with
``unknown_parameter``; what OpenAI has and this gateway cannot do (stored sessions, Decisions, hosted tools without a
backend for them) is refused with ``unsupported_parameter`` and says so.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.config import LiveConfig
from gateway.core.values import ProtocolError, check_fields, choice, field_of, non_empty
from gateway.live.events import CLIENT_EVENTS, SERVER_EVENTS

# OpenAI's built-in voices (both spellings the sources give of one of them).
BUILT_IN_VOICES = frozenset({
    "alloy", "ash", "aube", "ballad", "beacon", "bossa", "brise", "cedar", "cinder", "coral", "delta", "echo",
    "flitz", "gleam", "harema", "juni", "marin", "meridian", "nira", "noeul", "nuri", "quartz", "ripple", "sage",
    "shida", "shimmer", "shitan", "sillage", "stone", "tempo", "verse", "vesper", "willow",
})
DEFAULT_VOICE = "marin"
# Session formats: the wire ``type`` and its rates.
FORMATS = {"audio/pcm": (24000, 16000), "audio/pcmu": (8000,), "audio/pcma": (8000,)}
MAX_INPUT_MESSAGES = 128
SERVICE_TIERS = ("auto", "default", "flex", "priority", "ultrafast", "fast_tier_temp_pilot")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
RESPONSES_FIELDS = frozenset({"model", "instructions", "max_output_tokens", "parallel_tool_calls", "reasoning", "text",
                              "service_tier", "tool_choice", "tools"})
FUNCTION_FIELDS = frozenset({"type", "name", "description", "parameters", "strict"})
MCP_FIELDS = frozenset({"type", "server_label", "server_url", "server_description", "allowed_tools", "headers",
                        "require_approval", "authorization"})
# Tools OpenAI hosts (its search, files, containers, image model): no backend for them here.
HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "shell", "image_generation",
                "computer", "apply_patch", "custom", "namespace", "tool_search", "programmatic_tool_calling")


def tokens(text: str) -> int:
    """An estimate of ``text``'s tokens for the Live limits (no tokenizer of OpenAI's models is at hand): a token
    per 4 bytes of UTF-8 or per word, whichever is more (English runs ~4 characters a token)."""
    return max(len(text.split()), math.ceil(len(text.encode()) / 4))


@dataclass
class LiveSettings:
    id: str
    expires_at: int
    model: str  # as the client named it
    instructions: str | None
    input: list[dict[str, Any]]
    audio_format: dict[str, Any] | None  # None: negotiated by the transport (WebRTC)
    voice: str | dict[str, str]  # as the client named it
    delegation: dict[str, Any]  # {"type": "client"} or {"type": "responses", "responses": {...}}
    client: dict[str, Any] | None = None
    store: bool = False
    safety_identifier: str | None = None
    tts_voice: str = ""  # the configured voice that speaks
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def responses(self) -> dict[str, Any] | None:
        """The Responses delegation's settings, None in client mode."""
        return self.delegation.get("responses") if self.delegation["type"] == "responses" else None

    def wire(self) -> dict[str, Any]:
        """The SessionResource: the resolved configuration, its id and expiry, status always "active"."""
        audio: dict[str, Any] = {"output": {"voice": self.voice}}
        if self.audio_format is not None:
            audio["format"] = self.audio_format
        out: dict[str, Any] = {
            "id": self.id, "expires_at": self.expires_at, "model": self.model, "instructions": self.instructions,
            "audio": audio, "delegation": _delegation_wire(self.delegation), "status": "active", "input": self.input,
            "store": self.store,
        }
        if self.client is not None:
            out["client"] = self.client
        if self.safety_identifier is not None:
            out["safety_identifier"] = self.safety_identifier
        return out


def _delegation_wire(delegation: dict[str, Any]) -> dict[str, Any]:
    """The delegation as echoed: MCP authorizations are never sent back."""
    responses = delegation.get("responses")
    if not responses or not responses.get("tools"):
        return delegation
    tools = [{k: v for k, v in t.items() if k != "authorization"} for t in responses["tools"]]
    return {**delegation, "responses": {**responses, "tools": tools}}


def model_profile(name: str, config: LiveConfig) -> str:
    """The configured model ``name`` stands for (a prefix such as ``openai/`` is a router's and is dropped)."""
    served = [m.strip() for m in config.models.split(",") if m.strip()]
    bare = name.rsplit("/", 1)[-1]
    if bare not in served:
        listed = ", ".join(f"'{m}'" for m in served)
        raise ProtocolError("model_not_found", f"The model '{name[:100]}' is not served here; this gateway's Live "
                            f"models are {listed} ([live] models), also with a prefix such as 'openai/'.",
                            "session.model")
    return bare


def resolve_voice(voice: Any, config: LiveConfig, fallback: str, voices: Collection[str] | None) -> str:
    """The configured voice that speaks for ``voice`` (a built-in name or {"id": custom voice})."""
    param = "session.audio.output.voice"
    if isinstance(voice, dict):
        check_fields(voice, {"id"}, param)
        voice_id = non_empty(voice, "id", f"{param}.id", required=True)
        if voices is not None and voice_id not in voices:
            raise ProtocolError("invalid_value", f"No custom voice '{voice_id[:100]}' here.", f"{param}.id")
        return voice_id
    if not isinstance(voice, str) or not voice:
        raise ProtocolError("invalid_type", f"'{param}' must be a voice name or {{\"id\": ...}}.", param)
    mapped = config.voices.get(voice.lower())
    if mapped:
        return mapped
    if voices is not None and voice.lower() in voices:
        return voice  # one of the TTS engine's own voices, named directly
    if voice.lower() in BUILT_IN_VOICES:
        return config.voice or fallback
    known = "" if voices is None else f"; this gateway also has: {', '.join(sorted(voices))}"
    raise ProtocolError("invalid_value", f"Voice '{voice[:100]}' is not available: use one of OpenAI's built-in "
                        f"voice names{known}.", param)


def parse_start(body: Any, config: LiveConfig, *, session_id: str, expires_at: int, webrtc: bool,
                default_voice: str, voices: Collection[str] | None) -> LiveSettings:
    """session.start's ``session`` (or a WebRTC create's), resolved with the defaults."""
    if not isinstance(body, dict):
        raise ProtocolError("invalid_type", "'session' must be an object.", "session")
    allowed = {"model", "instructions", "input", "audio", "delegation", "client", "store", "safety_identifier",
               "triggers"}
    check_fields(body, allowed, "session")
    if "triggers" in body:
        raise _unsupported("session.triggers", "Decisions triggers are not supported by this gateway.")
    model = non_empty(body, "model", "session.model", required=True)
    model_profile(model, config)
    instructions = field_of(body, "instructions", str, "session.instructions")
    if instructions is not None and tokens(instructions) > config.max_instructions_tokens:
        raise ProtocolError("string_above_max_length", f"'session.instructions' may hold at most "
                            f"{config.max_instructions_tokens} tokens ([live] max_instructions_tokens).",
                            "session.instructions")
    history = _parse_input(body.get("input"), config)
    audio = field_of(body, "audio", dict, "session.audio") or {}
    check_fields(audio, {"format", "output"}, "session.audio")
    if webrtc and "format" in audio:
        raise ProtocolError("unknown_parameter", "Unknown parameter: 'session.audio.format' (WebRTC negotiates "
                            "the audio format in SDP).", "session.audio.format")
    audio_format = None if webrtc else _parse_format(audio.get("format"))
    output = field_of(audio, "output", dict, "session.audio.output") or {}
    check_fields(output, {"voice"}, "session.audio.output")
    voice = output.get("voice") if output.get("voice") is not None else DEFAULT_VOICE
    tts_voice = resolve_voice(voice, config, default_voice, voices)
    delegation = parse_delegation(body.get("delegation"))
    client = _parse_client(body.get("client"))
    store = field_of(body, "store", bool, "session.store") or False
    if store:
        raise _unsupported("session.store", "Stored sessions (forks and recordings) are not supported by this "
                           "gateway: send store false or leave it out.")
    safety = field_of(body, "safety_identifier", str, "session.safety_identifier")
    return LiveSettings(id=session_id, expires_at=expires_at, model=model, instructions=instructions, input=history,
                        audio_format=audio_format, voice=voice, delegation=delegation, client=client, store=False,
                        safety_identifier=safety, tts_voice=tts_voice)


def _unsupported(param: str, message: str) -> ProtocolError:
    return ProtocolError("unsupported_parameter", message, param)


def _parse_format(value: Any) -> dict[str, Any]:
    param = "session.audio.format"
    if value is None:
        return {"type": "audio/pcm", "rate": 24000}
    fmt = field_of({"f": value}, "f", dict, param)
    check_fields(fmt, {"type", "rate"}, param)
    kind = choice(field_of(fmt, "type", str, f"{param}.type", required=True), tuple(FORMATS), f"{param}.type")
    rates = FORMATS[kind]
    rate = field_of(fmt, "rate", int, f"{param}.rate")
    if rate is None:
        rate = rates[0]
    if rate not in rates:
        raise ProtocolError("invalid_value", f"'{param}.rate' for {kind} must be "
                            f"{' or '.join(map(str, rates))}.", f"{param}.rate")
    return {"type": kind, "rate": rate}


def _parse_input(value: Any, config: LiveConfig) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError("invalid_type", "'session.input' must be an array of messages.", "session.input")
    if len(value) > MAX_INPUT_MESSAGES:
        raise ProtocolError("array_above_max_length", f"'session.input' may hold at most {MAX_INPUT_MESSAGES} "
                            "messages.", "session.input")
    total = 0
    for i, message in enumerate(value):
        param = f"session.input[{i}]"
        if not isinstance(message, dict):
            raise ProtocolError("invalid_type", f"'{param}' must be a message object.", param)
        check_fields(message, {"type", "role", "content", "id", "status"}, param)
        if message.get("type", "message") != "message":
            raise ProtocolError("invalid_value", f"'{param}.type' must be 'message'.", f"{param}.type")
        role = choice(message.get("role"), ("developer", "user", "assistant"), f"{param}.role")
        field_of(message, "id", str, f"{param}.id")
        if message.get("status") is not None:
            choice(message["status"], ("incomplete", "completed"), f"{param}.status")
        content = message.get("content")
        if not isinstance(content, list) or len(content) != 1 or not isinstance(content[0], dict):
            raise ProtocolError("invalid_value", f"'{param}.content' must hold exactly one text part.",
                                f"{param}.content")
        part = content[0]
        check_fields(part, {"type", "text"}, f"{param}.content[0]")
        kinds = ("output_text", "text") if role == "assistant" else ("input_text",)
        if role != "assistant" or "type" in part:
            choice(part.get("type"), kinds, f"{param}.content[0].type")
        total += tokens(field_of(part, "text", str, f"{param}.content[0].text", required=True))
    if total > config.max_input_tokens:
        raise ProtocolError("string_above_max_length", f"'session.input' may hold at most {config.max_input_tokens} "
                            "tokens of text ([live] max_input_tokens).", "session.input")
    return value


def parse_delegation(value: Any) -> dict[str, Any]:
    param = "session.delegation"
    if value is None:
        return {"type": "client"}
    delegation = field_of({"d": value}, "d", dict, param)
    kind = field_of(delegation, "type", str, f"{param}.type", required=True)
    if kind == "decisions":
        raise _unsupported(f"{param}.type", "Decisions delegation is not supported by this gateway: use 'client' or "
                           "'responses'.")
    choice(kind, ("client", "responses"), f"{param}.type")
    ack = field_of(delegation, "acknowledgement_delay_ms", int, f"{param}.acknowledgement_delay_ms")
    if ack is not None and ack < 0:
        raise ProtocolError("invalid_value", f"'{param}.acknowledgement_delay_ms' must not be negative.",
                            f"{param}.acknowledgement_delay_ms")
    if kind == "client":
        check_fields(delegation, {"type", "acknowledgement_delay_ms"}, param)
        return dict(delegation)
    check_fields(delegation, {"type", "responses", "acknowledgement_delay_ms"}, param)
    responses = field_of(delegation, "responses", dict, f"{param}.responses", required=True)
    return {**delegation, "responses": parse_responses(responses, f"{param}.responses", {})}


def parse_responses(body: dict[str, Any], param: str, current: dict[str, Any]) -> dict[str, Any]:
    """``delegation.responses`` as sent at the start (``current`` empty: ``model`` required) or patched."""
    check_fields(body, RESPONSES_FIELDS, param)
    out = dict(current)
    model = non_empty(body, "model", f"{param}.model", required=not current)
    if model is not None:
        out["model"] = model
    if "instructions" in body:
        out["instructions"] = field_of(body, "instructions", str, f"{param}.instructions")
    if (limit := field_of(body, "max_output_tokens", int, f"{param}.max_output_tokens")) is not None:
        if limit < 16:
            raise ProtocolError("integer_below_min_value", f"'{param}.max_output_tokens' must be at least 16.",
                                f"{param}.max_output_tokens")
        out["max_output_tokens"] = limit
    if (parallel := field_of(body, "parallel_tool_calls", bool, f"{param}.parallel_tool_calls")) is not None:
        out["parallel_tool_calls"] = parallel
    if (reasoning := field_of(body, "reasoning", dict, f"{param}.reasoning")) is not None:
        check_fields(reasoning, {"effort", "summary"}, f"{param}.reasoning")
        if reasoning.get("effort") is not None:
            choice(reasoning["effort"], EFFORTS, f"{param}.reasoning.effort")
        if reasoning.get("summary") is not None:
            choice(reasoning["summary"], ("concise", "detailed", "auto"), f"{param}.reasoning.summary")
        out["reasoning"] = reasoning
    if (text := field_of(body, "text", dict, f"{param}.text")) is not None:
        check_fields(text, {"verbosity"}, f"{param}.text")
        if text.get("verbosity") is not None:
            choice(text["verbosity"], ("low", "medium", "high"), f"{param}.text.verbosity")
        out["text"] = text
    if body.get("service_tier") is not None:
        out["service_tier"] = choice(body["service_tier"], SERVICE_TIERS, f"{param}.service_tier")
    if "tools" in body:
        out["tools"] = _parse_tools(body["tools"], f"{param}.tools")
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _parse_tool_choice(body["tool_choice"], out.get("tools") or [], f"{param}.tool_choice")
    return out


def _parse_tools(value: Any, param: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError("invalid_type", f"'{param}' must be an array of tools.", param)
    names: set[str] = set()
    tools = []
    for i, tool in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(tool, dict):
            raise ProtocolError("invalid_type", f"'{where}' must be a tool object.", where)
        kind = field_of(tool, "type", str, f"{where}.type", required=True)
        if kind in HOSTED_TOOLS:
            raise _unsupported(f"{where}.type", f"The '{kind}' tool runs on OpenAI's servers; this gateway has no "
                               "backend for it. Give the delegated model function tools (or MCP servers) instead.")
        choice(kind, ("function", "mcp"), f"{where}.type")
        if kind == "function":
            check_fields(tool, FUNCTION_FIELDS, where)
            name = non_empty(tool, "name", f"{where}.name", required=True)
            if name in names:
                raise ProtocolError("invalid_value", f"Duplicate tool name '{name[:64]}'.", f"{where}.name")
            names.add(name)
            field_of(tool, "description", str, f"{where}.description")
            field_of(tool, "parameters", dict, f"{where}.parameters")
            field_of(tool, "strict", bool, f"{where}.strict")
        else:
            check_fields(tool, MCP_FIELDS, where)
            non_empty(tool, "server_label", f"{where}.server_label", required=True)
            non_empty(tool, "server_url", f"{where}.server_url", required=True)
        tools.append(tool)
    return tools


def _parse_tool_choice(value: Any, tools: list[dict[str, Any]], param: str) -> str | dict[str, Any]:
    if isinstance(value, str):
        return choice(value, ("auto", "none", "required"), param)
    if not isinstance(value, dict):
        raise ProtocolError("invalid_type", f"'{param}' must be a string or an object.", param)
    kind = choice(value.get("type"), ("function", "mcp"), f"{param}.type")
    if kind == "function":
        check_fields(value, {"type", "name"}, param)
        name = non_empty(value, "name", f"{param}.name", required=True)
        if not any(t.get("type") == "function" and t.get("name") == name for t in tools):
            raise ProtocolError("invalid_value", f"Tool '{name[:64]}' is not among the tools.", f"{param}.name")
    else:
        check_fields(value, {"type", "name", "server_label"}, param)
        non_empty(value, "name", f"{param}.name", required=True)
        non_empty(value, "server_label", f"{param}.server_label", required=True)
    return value


def _parse_client(value: Any) -> dict[str, Any] | None:
    param = "session.client"
    if value is None:
        return None
    client = field_of({"c": value}, "c", dict, param)
    check_fields(client, {"data_channel"}, param)
    channel = field_of(client, "data_channel", dict, f"{param}.data_channel", required=True)
    check_fields(channel, {"allowed_client_events", "allowed_server_events"}, f"{param}.data_channel")
    allowed = channel.get("allowed_client_events")
    where = f"{param}.data_channel.allowed_client_events"
    if allowed is not None and allowed != "all":
        if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
            raise ProtocolError("invalid_type", f"'{where}' must be 'all' or an array of event types.", where)
        for kind in allowed:
            choice(kind, CLIENT_EVENTS, where)
    selectors = channel.get("allowed_server_events")
    where = f"{param}.data_channel.allowed_server_events"
    if selectors is not None and selectors != "all":
        if not isinstance(selectors, list):
            raise ProtocolError("invalid_type", f"'{where}' must be 'all' or an array of selectors.", where)
        for i, selector in enumerate(selectors):
            at = f"{where}[{i}]"
            if not isinstance(selector, dict):
                raise ProtocolError("invalid_type", f"'{at}' must be an object.", at)
            check_fields(selector, {"type", "response_event"}, at)
            kind = choice(selector.get("type"), SERVER_EVENTS, f"{at}.type")
            nested = field_of(selector, "response_event", str, f"{at}.response_event")
            if (kind == "response.event") != (nested is not None):
                raise ProtocolError("invalid_value", f"'{at}.response_event' is required with type 'response.event' "
                                    "and forbidden otherwise.", f"{at}.response_event")
    return client


def parse_update(body: Any, settings: LiveSettings) -> LiveSettings:
    """session.update: a patch of ``delegation.responses`` (with or without ``type``, as the Vercel AI SDK sends
    it); the delegation's type and everything else are fixed."""
    if not isinstance(body, dict):
        raise ProtocolError("invalid_type", "'session' must be an object.", "session")
    fixed = ("model", "instructions", "input", "audio", "client", "store", "safety_identifier")
    for key in body:
        if key in fixed:
            raise ProtocolError("immutable_field_update", f"'session.{key}' cannot change after the session "
                                "started; only 'session.delegation.responses' can.", f"session.{key}")
    check_fields(body, {"delegation", "triggers"}, "session")
    if "triggers" in body:
        raise _unsupported("session.triggers", "Decisions triggers are not supported by this gateway.")
    if "delegation" not in body:
        return settings
    delegation = body["delegation"]
    current = settings.delegation
    param = "session.delegation.type"
    if delegation is None:
        if current["type"] != "client":
            raise ProtocolError("immutable_field_update", "The delegation type cannot change after the session "
                                f"started (it is '{current['type']}').", param)
        return settings
    delegation = field_of({"d": delegation}, "d", dict, "session.delegation")
    kind = delegation.get("type", current["type"])
    if kind != current["type"]:
        raise ProtocolError("immutable_field_update", "The delegation type cannot change after the session started "
                            f"(it is '{current['type']}').", param)
    new = dict(current)
    if kind == "client":
        check_fields(delegation, {"type", "acknowledgement_delay_ms"}, "session.delegation")
    else:
        check_fields(delegation, {"type", "responses", "acknowledgement_delay_ms"}, "session.delegation")
        patch = field_of(delegation, "responses", dict, "session.delegation.responses")
        if patch is not None:
            new["responses"] = parse_responses(patch, "session.delegation.responses", current["responses"])
    if (ack := field_of(delegation, "acknowledgement_delay_ms", int,
                        "session.delegation.acknowledgement_delay_ms")) is not None:
        new["acknowledgement_delay_ms"] = ack
    return replace(settings, delegation=new)


def data_channel_lists(settings: LiveSettings) -> tuple[frozenset[str] | None, list[dict[str, Any]] | None]:
    """The data channel's allowed client event types and server event selectors (None: all)."""
    channel = (settings.client or {}).get("data_channel") or {}
    clients = channel.get("allowed_client_events")
    servers = channel.get("allowed_server_events")
    return (None if clients in (None, "all") else frozenset(clients),
            None if servers in (None, "all") else list(servers))


def server_event_allowed(event: dict[str, Any], selectors: list[dict[str, Any]] | None) -> bool:
    """Whether a server event may go out on the data channel (errors and info always do)."""
    if selectors is None or event["type"] in ("error", "info"):
        return True
    for selector in selectors:
        if selector["type"] == event["type"] and (
                event["type"] != "response.event" or selector["response_event"] == event["event"].get("type")):
            return True
    return False
