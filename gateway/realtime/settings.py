"""The session object: its settings, session.update read in either shape, and session.created/updated rendered."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.core.values import check_fields, choice, field_of, non_empty, parse_prompt, parse_reasoning
from gateway.realtime.events import AUDIO_FORMATS, GA_FORMATS, Dialect, ProtocolError
from gateway.realtime.tools import Tool

# What a beta session reports as its temperature until the client sets one (OpenAI's default).
DEFAULT_TEMPERATURE = 0.8

# The fields of each session object, OpenAI's (tests/realtime/test_validation.py holds them to the openai SDK's
# types). Any other is refused with unknown_parameter, as OpenAI refuses it: a beta field in a GA update
# (input_audio_format, modalities, voice) would otherwise be "updated" and change nothing.
GA_FIELDS = {
    "session": frozenset({"type", "audio", "include", "instructions", "max_output_tokens", "model",
                          "output_modalities", "parallel_tool_calls", "prompt", "reasoning", "tool_choice", "tools",
                          "tracing", "truncation"}),
    "session.audio": frozenset({"input", "output"}),
    "session.audio.input": frozenset({"format", "noise_reduction", "transcription", "turn_detection"}),
    "session.audio.output": frozenset({"format", "speed", "voice"}),
}
BETA_FIELDS = frozenset({"client_secret", "input_audio_format", "input_audio_noise_reduction",
                         "input_audio_transcription", "instructions", "max_response_output_tokens", "modalities",
                         "model", "output_audio_format", "speed", "temperature", "tool_choice", "tools", "tracing",
                         "turn_detection", "voice"})
BETA_TRANSCRIPTION_FIELDS = frozenset({"client_secret", "include", "input_audio_format", "input_audio_noise_reduction",
                                       "input_audio_transcription", "modalities", "turn_detection"})


@dataclass(frozen=True)
class TurnDetection:
    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    eagerness: str = "auto"  # semantic_vad only: how readily a pause ends the turn (gateway/runtime/smart_turn.py)


@dataclass(frozen=True)
class Transcription:
    """What the client asked of input transcription; reported back. The gateway's own STT answers
    (its [stt] model); language and prompt go to it, the other hints are kept and reported only."""

    model: str = "whisper-1"
    language: str | None = None
    prompt: str | None = None
    delay: str | None = None  # GA only, as the rest below
    keywords: list[str] | None = None
    languages: list[str] | None = None


@dataclass(frozen=True)
class SessionSettings:
    id: str
    model: str
    instructions: str
    voice: str
    # "realtime" (a conversation that responds) or "transcription" (turns transcribed, never answered).
    type: str = "realtime"
    modalities: list[str] = field(default_factory=lambda: ["audio"])
    input_format: str = "pcm16"
    output_format: str = "pcm16"
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription: Transcription | None = None
    noise_reduction: dict[str, Any] | None = None  # {type, strength?}: kept and reported back
    # A beta client's temperature; None until it sets one: the session reports OpenAI's default
    # (DEFAULT_TEMPERATURE) and the LLM samples at its own configured temperature.
    temperature: float | None = None
    max_output_tokens: int | str = "inf"
    speed: float = 1.0
    tools: list[Tool] = field(default_factory=list)  # read by gateway/realtime/tools.py, not by parse_session
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool | None = None  # GA; None: the LLM's own (parallel); False: one call a round
    # GA settings the gateway keeps and reports back but does not act on.
    tracing: str | dict[str, Any] | None = None
    truncation: str | dict[str, Any] = "auto"
    prompt: dict[str, Any] | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None


def _parse_format_ga(value: Any, param: str) -> str:
    fmt = field_of({"f": value}, "f", dict, param, required=True)
    kind = field_of(fmt, "type", str, f"{param}.type", required=True)
    for name, ga in GA_FORMATS.items():
        if kind == ga:
            if name == "pcm16":
                rate = field_of(fmt, "rate", int, f"{param}.rate")
                if rate not in (None, 24000):
                    raise ProtocolError(
                        "invalid_value", f"Invalid value for '{param}.rate': only 24000 is supported.",
                        f"{param}.rate",
                    )
            return name
    return choice(kind, tuple(GA_FORMATS.values()), f"{param}.type")


def _parse_turn_detection(value: Any, current: TurnDetection | None, defaults: TurnDetection,
                          param: str) -> TurnDetection | None:
    if value is None:
        return None
    td = field_of({"t": value}, "t", dict, param, required=True)
    kind = field_of(td, "type", str, f"{param}.type")
    if kind is None:
        kind = current.type if current else "server_vad"
    choice(kind, ("server_vad", "semantic_vad"), f"{param}.type")
    changes: dict[str, Any] = {"type": kind}
    if (eagerness := field_of(td, "eagerness", str, f"{param}.eagerness")) is not None:
        changes["eagerness"] = choice(eagerness, ("low", "medium", "high", "auto"), f"{param}.eagerness")
    threshold = field_of(td, "threshold", float, f"{param}.threshold")
    if threshold is not None:
        if not 0.0 <= threshold <= 1.0:
            raise ProtocolError("invalid_value", f"'{param}.threshold' must be between 0 and 1.", f"{param}.threshold")
        changes["threshold"] = float(threshold)
    for key in ("prefix_padding_ms", "silence_duration_ms"):
        ms = field_of(td, key, int, f"{param}.{key}")
        if ms is not None:
            if not 0 <= ms <= 10_000:
                raise ProtocolError("invalid_value", f"'{param}.{key}' must be between 0 and 10000.", f"{param}.{key}")
            changes[key] = ms
    if "idle_timeout_ms" in td:
        idle = field_of(td, "idle_timeout_ms", int, f"{param}.idle_timeout_ms")
        if idle is not None and not 5_000 <= idle <= 30_000:
            raise ProtocolError(
                "invalid_value", f"'{param}.idle_timeout_ms' must be between 5000 and 30000.",
                f"{param}.idle_timeout_ms",
            )
        changes["idle_timeout_ms"] = idle
    for key in ("create_response", "interrupt_response"):
        flag = field_of(td, key, bool, f"{param}.{key}")
        if flag is not None:
            changes[key] = flag
    return replace(current or defaults, **changes)


def _parse_transcription(value: Any, param: str, dialect: Dialect) -> Transcription | None:
    if value is None:
        return None
    tr = field_of({"t": value}, "t", dict, param, required=True)
    model = non_empty(tr, "model", f"{param}.model") or "whisper-1"
    language = non_empty(tr, "language", f"{param}.language")
    prompt = field_of(tr, "prompt", str, f"{param}.prompt")
    if dialect is not Dialect.GA:
        return Transcription(model, language, prompt)
    if (delay := field_of(tr, "delay", str, f"{param}.delay")) is not None:
        delay = choice(delay, ("minimal", "low", "medium", "high", "xhigh"), f"{param}.delay")
    return Transcription(model, language, prompt, delay, _strings(tr, "keywords", f"{param}.keywords"),
                         _strings(tr, "languages", f"{param}.languages"))


def _strings(obj: dict[str, Any], key: str, param: str) -> list[str] | None:
    values = field_of(obj, key, list, param)
    for i, value in enumerate(values or []):
        non_empty({"v": value}, "v", f"{param}[{i}]", required=True)
    return values


def _parse_noise_reduction(obj: dict[str, Any], key: str, param: str,
                           current: dict[str, Any] | None) -> dict[str, Any] | None:
    """{type, strength}: what is sent changes (strength alone keeps the type), null turns it off."""
    nr = field_of(obj, key, dict, param)
    if nr is None:
        return None
    out = dict(current or {"type": "near_field"})
    if (kind := field_of(nr, "type", str, f"{param}.type")) is not None:
        out["type"] = choice(kind, ("near_field", "far_field"), f"{param}.type")
    if (strength := field_of(nr, "strength", float, f"{param}.strength")) is not None:
        if not 0.0 <= strength <= 1.0:
            raise ProtocolError("invalid_value", f"'{param}.strength' must be between 0 and 1.", f"{param}.strength")
        out["strength"] = strength
    return out


def _parse_modalities(value: Any, param: str) -> list[str]:
    mods = field_of({"m": value}, "m", list, param, required=True)
    for i, m in enumerate(mods):
        choice(m, ("text", "audio"), f"{param}[{i}]")
    if not mods:
        raise ProtocolError("invalid_value", f"'{param}' must not be empty.", param)
    # ["text", "audio"] (beta's default) means audio with its transcript.
    return ["audio"] if "audio" in mods else ["text"]


def _parse_max_tokens(value: Any, param: str) -> int | str:
    if value == "inf":
        return "inf"
    n = field_of({"n": value}, "n", int, param, required=True)
    if not 1 <= n <= 4096:
        raise ProtocolError("invalid_value", f"'{param}' must be between 1 and 4096, or \"inf\".", param)
    return n


def parse_session(
    body: Any, current: SessionSettings, dialect: Dialect, voice_locked: bool, vad_defaults: TurnDetection,
    voices: Collection[str] | None = None, transcription_update: bool = False,
) -> SessionSettings:
    """A session.update's ``session`` applied to ``current``; only the fields sent change. Turn detection
    switched on starts from ``vad_defaults``; ``voices`` are the voices the speech engine has (None: any).

    The session's type comes from the update: GA ``session.type``, beta's event name
    (``transcription_update``: a transcription_session.update, always beta-shaped); a GA update without a
    type keeps the session's. Every field sent is checked, whatever the session's type."""
    s = field_of({"session": body}, "session", dict, "session", required=True)
    new: dict[str, Any] = {}  # the fields the update changes
    if transcription_update:
        check_fields(s, BETA_TRANSCRIPTION_FIELDS, "session")
        new["type"] = "transcription"
        _parse_input_beta(s, current, new, vad_defaults)
        if "modalities" in s:
            _parse_modalities(s["modalities"], "session.modalities")  # checked; nothing to respond with
        _parse_include(s, new)
        return replace(current, **new)
    if dialect is Dialect.BETA:
        check_fields(s, BETA_FIELDS, "session")
        new["type"] = "realtime"
        _parse_realtime_beta(s, current, new, vad_defaults, voice_locked, voices)
        return replace(current, **new)
    check_fields(s, GA_FIELDS["session"], "session")
    if (kind := field_of(s, "type", str, "session.type")) is not None:
        new["type"] = choice(kind, ("realtime", "transcription"), "session.type")
    audio = field_of(s, "audio", dict, "session.audio") or {}
    check_fields(audio, GA_FIELDS["session.audio"], "session.audio")
    inp = field_of(audio, "input", dict, "session.audio.input") or {}
    check_fields(inp, GA_FIELDS["session.audio.input"], "session.audio.input")
    _parse_input_ga(inp, current, new, vad_defaults)
    _parse_include(s, new)
    # Also in a transcription session, which does not use them: a client's mistake is reported, not
    # accepted unseen, and the session keeps them for a switch back to realtime.
    _parse_realtime_ga(s, audio, current, new, voice_locked, voices)
    return replace(current, **new)


def _parse_input_ga(inp: dict[str, Any], current: SessionSettings, new: dict[str, Any],
                    vad_defaults: TurnDetection) -> None:
    param = "session.audio.input"
    if inp.get("format") is not None:
        new["input_format"] = _parse_format_ga(inp["format"], f"{param}.format")
    if "turn_detection" in inp:
        new["turn_detection"] = _parse_turn_detection(
            inp["turn_detection"], current.turn_detection, vad_defaults, f"{param}.turn_detection"
        )
    if "transcription" in inp:
        new["transcription"] = _parse_transcription(inp["transcription"], f"{param}.transcription", Dialect.GA)
    if "noise_reduction" in inp:
        new["noise_reduction"] = _parse_noise_reduction(inp, "noise_reduction", f"{param}.noise_reduction",
                                                     current.noise_reduction)


def _parse_input_beta(s: dict[str, Any], current: SessionSettings, new: dict[str, Any],
                      vad_defaults: TurnDetection) -> None:
    if (fmt := field_of(s, "input_audio_format", str, "session.input_audio_format")) is not None:
        new["input_format"] = choice(fmt, AUDIO_FORMATS, "session.input_audio_format")
    if "turn_detection" in s:
        new["turn_detection"] = _parse_turn_detection(
            s["turn_detection"], current.turn_detection, vad_defaults, "session.turn_detection"
        )
    if "input_audio_transcription" in s:
        new["transcription"] = _parse_transcription(
            s["input_audio_transcription"], "session.input_audio_transcription", Dialect.BETA
        )
    if "input_audio_noise_reduction" in s:
        new["noise_reduction"] = _parse_noise_reduction(
            s, "input_audio_noise_reduction", "session.input_audio_noise_reduction", current.noise_reduction
        )


def _parse_include(s: dict[str, Any], new: dict[str, Any]) -> None:
    if "include" in s:
        include = field_of(s, "include", list, "session.include")
        for i, entry in enumerate(include or []):
            choice(entry, ("item.input_audio_transcription.logprobs",), f"session.include[{i}]")
        new["include"] = include


def _parse_realtime_ga(s: dict[str, Any], audio: dict[str, Any], current: SessionSettings, new: dict[str, Any],
                       voice_locked: bool, voices: Collection[str] | None) -> None:
    _parse_common(s, new)
    if "output_modalities" in s:
        new["modalities"] = _parse_modalities(s["output_modalities"], "session.output_modalities")
    if "max_output_tokens" in s:
        new["max_output_tokens"] = _parse_max_tokens(s["max_output_tokens"], "session.max_output_tokens")
    out = field_of(audio, "output", dict, "session.audio.output") or {}
    check_fields(out, GA_FIELDS["session.audio.output"], "session.audio.output")
    if out.get("format") is not None:
        new["output_format"] = _parse_format_ga(out["format"], "session.audio.output.format")
    voice = field_of(out, "voice", (str, dict), "session.audio.output.voice")
    if isinstance(voice, dict):
        voice = non_empty(voice, "id", "session.audio.output.voice.id", required=True)
    elif voice is not None:
        non_empty(out, "voice", "session.audio.output.voice")
    _parse_voice(voice, field_of(out, "speed", float, "session.audio.output.speed"), "session.audio.output",
                 current, new, voice_locked, voices)
    _parse_ga_extras(s, new)


def _parse_realtime_beta(s: dict[str, Any], current: SessionSettings, new: dict[str, Any],
                         vad_defaults: TurnDetection, voice_locked: bool, voices: Collection[str] | None) -> None:
    _parse_common(s, new)
    _parse_input_beta(s, current, new, vad_defaults)
    if "modalities" in s:
        new["modalities"] = _parse_modalities(s["modalities"], "session.modalities")
    if "max_response_output_tokens" in s:
        new["max_output_tokens"] = _parse_max_tokens(s["max_response_output_tokens"],
                                                     "session.max_response_output_tokens")
    if (fmt := field_of(s, "output_audio_format", str, "session.output_audio_format")) is not None:
        new["output_format"] = choice(fmt, AUDIO_FORMATS, "session.output_audio_format")
    if (temperature := parse_temperature(s, "session.temperature")) is not None:
        new["temperature"] = temperature
    if "tracing" in s:
        new["tracing"] = _parse_tracing(s)
    _parse_voice(non_empty(s, "voice", "session.voice"), field_of(s, "speed", float, "session.speed"), "session",
                 current, new, voice_locked, voices)


def _parse_common(s: dict[str, Any], new: dict[str, Any]) -> None:
    """Fields both shapes of a realtime session share."""
    if (instructions := field_of(s, "instructions", str, "session.instructions")) is not None:
        new["instructions"] = instructions
    if (model := non_empty(s, "model", "session.model")) is not None:
        new["model"] = model
    # tools and tool_choice are read by gateway/realtime/tools.py (the session calls it).


def _parse_voice(voice: str | None, speed: float | None, where: str, current: SessionSettings, new: dict[str, Any],
                 voice_locked: bool, voices: Collection[str] | None) -> None:
    voice_param = f"{where}.voice"
    if voice is not None:
        if voice != current.voice and voice_locked:
            raise ProtocolError(
                "cannot_update_voice", "Cannot update a session's voice after audio has been output.", voice_param
            )
        new["voice"] = check_voice(voice, voices, voice_param)
    if speed is not None:
        if not 0.25 <= speed <= 1.5:
            raise ProtocolError("invalid_value", "speed must be between 0.25 and 1.5.", f"{where}.speed")
        new["speed"] = float(speed)


def parse_temperature(obj: dict[str, Any], param: str) -> float | None:
    temperature = field_of(obj, "temperature", float, param)
    if temperature is not None and not 0.6 <= temperature <= 1.2:
        raise ProtocolError("invalid_value", f"'{param}' must be between 0.6 and 1.2.", param)
    return None if temperature is None else float(temperature)


def response_format(params: dict[str, Any], dialect: Dialect) -> str | None:
    """A response.create's own output audio format, if it sets one."""
    if dialect is Dialect.GA:
        audio = field_of(params, "audio", dict, "response.audio") or {}
        out = field_of(audio, "output", dict, "response.audio.output") or {}
        fmt = out.get("format")
        return None if fmt is None else _parse_format_ga(fmt, "response.audio.output.format")
    fmt = field_of(params, "output_audio_format", str, "response.output_audio_format")
    return None if fmt is None else choice(fmt, AUDIO_FORMATS, "response.output_audio_format")


def check_voice(name: str, voices: Collection[str] | None, param: str) -> str:
    if voices is not None and name.lower() not in voices:
        raise ProtocolError(
            "invalid_value", f"Voice '{name}' is not available; this gateway has: {', '.join(sorted(voices))}.", param
        )
    return name


def _parse_ga_extras(s: dict[str, Any], new: dict[str, Any]) -> None:
    """Settings kept and reported back as sent (the gateway has no tracing, truncation policy, stored
    prompts or reasoning control): their shape is checked, their content is not acted on."""
    if "tracing" in s:
        new["tracing"] = _parse_tracing(s)
    if "truncation" in s:
        truncation = field_of(s, "truncation", (str, dict), "session.truncation")
        if isinstance(truncation, str):
            choice(truncation, ("auto", "disabled"), "session.truncation")
        elif truncation is not None:
            param = "session.truncation"
            choice(field_of(truncation, "type", str, f"{param}.type", required=True), ("retention_ratio",),
                    f"{param}.type")
            ratio = field_of(truncation, "retention_ratio", float, f"{param}.retention_ratio", required=True)
            if not 0.0 <= ratio <= 1.0:
                raise ProtocolError("invalid_value", f"'{param}.retention_ratio' must be between 0 and 1.",
                                    f"{param}.retention_ratio")
            limits = field_of(truncation, "token_limits", dict, f"{param}.token_limits") or {}
            field_of(limits, "post_instructions", int, f"{param}.token_limits.post_instructions")
        new["truncation"] = truncation or "auto"
    if "parallel_tool_calls" in s:
        new["parallel_tool_calls"] = field_of(s, "parallel_tool_calls", bool, "session.parallel_tool_calls")
    if "prompt" in s:
        new["prompt"] = parse_prompt(s, "prompt", "session.prompt")
    if "reasoning" in s:
        new["reasoning"] = parse_reasoning(s, "reasoning", "session.reasoning")


def _parse_tracing(s: dict[str, Any]) -> str | dict[str, Any] | None:
    tracing = field_of(s, "tracing", (str, dict), "session.tracing")
    if isinstance(tracing, str):
        choice(tracing, ("auto",), "session.tracing")
    elif tracing is not None:
        for key in ("workflow_name", "group_id"):
            field_of(tracing, key, str, f"session.tracing.{key}")
        field_of(tracing, "metadata", dict, "session.tracing.metadata")
    return tracing


def _td_wire(td: TurnDetection | None, dialect: Dialect, transcription: bool = False) -> dict[str, Any] | None:
    """Turn detection as reported; a transcription session's has no response settings."""
    if td is None:
        return None
    if td.type == "semantic_vad":
        out: dict[str, Any] = {"type": td.type, "eagerness": td.eagerness}
    else:
        out = {"type": td.type, "threshold": td.threshold, "prefix_padding_ms": td.prefix_padding_ms,
               "silence_duration_ms": td.silence_duration_ms}
    if transcription:
        return out
    out.update(create_response=td.create_response, interrupt_response=td.interrupt_response)
    if dialect is Dialect.GA and td.type == "server_vad":
        out["idle_timeout_ms"] = td.idle_timeout_ms
    return out


def _tr_wire(tr: Transcription | None, dialect: Dialect) -> dict[str, Any] | None:
    if tr is None:
        return None
    out: dict[str, Any] = {"model": tr.model, "language": tr.language, "prompt": tr.prompt}
    if dialect is Dialect.GA:
        hints = {"delay": tr.delay, "keywords": tr.keywords, "languages": tr.languages}
        out.update((k, v) for k, v in hints.items() if v is not None)
    return out


def _noise_wire(nr: dict[str, Any] | None, dialect: Dialect) -> dict[str, Any] | None:
    return nr if nr is None or dialect is Dialect.GA else {"type": nr["type"]}


def format_wire(name: str) -> dict[str, Any]:
    return {"type": "audio/pcm", "rate": 24000} if name == "pcm16" else {"type": GA_FORMATS[name]}


def session_wire(s: SessionSettings, dialect: Dialect) -> dict[str, Any]:
    """The session object of session.created/updated, for the session's type and the dialect."""
    noise = _noise_wire(s.noise_reduction, dialect)
    transcription = s.type == "transcription"
    td = _td_wire(s.turn_detection, dialect, transcription)
    if dialect is Dialect.GA:
        audio_input = {"format": format_wire(s.input_format), "transcription": _tr_wire(s.transcription, dialect),
                       "noise_reduction": noise, "turn_detection": td}
        if transcription:
            return {"type": "transcription", "object": "realtime.transcription_session", "id": s.id,
                    "audio": {"input": audio_input}, "include": s.include}
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": s.id,
            "model": s.model,
            "output_modalities": s.modalities,
            "instructions": s.instructions,
            "tools": [t.wire() for t in s.tools],
            "tool_choice": s.tool_choice,
            **({} if s.parallel_tool_calls is None else {"parallel_tool_calls": s.parallel_tool_calls}),
            "max_output_tokens": s.max_output_tokens,
            "tracing": s.tracing,
            "truncation": s.truncation,
            "prompt": s.prompt,
            "include": s.include,
            "reasoning": s.reasoning,
            "audio": {
                "input": audio_input,
                "output": {"format": format_wire(s.output_format), "voice": s.voice, "speed": s.speed},
            },
        }
    if transcription:
        # No client_secret: OpenAI sends it only in the REST answer that minted one.
        return {"id": s.id, "object": "realtime.transcription_session", "input_audio_format": s.input_format,
                "input_audio_transcription": _tr_wire(s.transcription, dialect),
                "input_audio_noise_reduction": noise, "turn_detection": td, "include": s.include}
    return {
        "id": s.id,
        "object": "realtime.session",
        "model": s.model,
        "modalities": ["text", "audio"] if s.modalities == ["audio"] else ["text"],
        "instructions": s.instructions,
        "voice": s.voice,
        "input_audio_format": s.input_format,
        "output_audio_format": s.output_format,
        "input_audio_transcription": _tr_wire(s.transcription, dialect),
        "input_audio_noise_reduction": noise,
        "turn_detection": td,
        "tools": [t.wire() for t in s.tools],
        # Beta's tool_choice is a string: a named function is its name.
        "tool_choice": s.tool_choice["name"] if isinstance(s.tool_choice, dict) else s.tool_choice,
        "temperature": DEFAULT_TEMPERATURE if s.temperature is None else s.temperature,
        "max_response_output_tokens": s.max_output_tokens,
        "speed": s.speed,
        "tracing": s.tracing,
    }

