"""A fuzzer over every session and response field: invalid values are refused, naming the field, and
change nothing.

The fields come from the openai SDK's own types (GA and beta, realtime and transcription sessions,
response.create), walked recursively; each gets the values of the wrong JSON type for it and, for an
enumeration, a value outside it. Hand-written cases add what types cannot say (ranges, empty strings,
metadata limits). Tools, tool_choice and parallel_tool_calls are validated apart (gateway/tools
work), client_secret is a REST field; response.input (conversation items) and the values of
prompt.variables (content parts) are fuzzed at their top level only.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from openai.types.beta.realtime.response_create_event import Response as BetaResponse
from openai.types.beta.realtime.session_update_event import Session as BetaSession
from openai.types.beta.realtime.transcription_session_update import Session as BetaTranscriptionSession
from openai.types.realtime import (
    RealtimeResponseCreateParams,
    RealtimeSessionCreateRequest,
    RealtimeTranscriptionSessionCreateRequest,
)
from pydantic import BaseModel

from gateway.realtime import settings
from gateway.realtime.effects import SendEvent, StartResponse
from gateway.realtime.events import Dialect
from gateway.realtime.response_params import FIELDS
from gateway.realtime.session import Session
from tests.conftest import make_config

SKIPPED = {"tools", "tool_choice", "parallel_tool_calls", "client_secret"}
# Names the gateway takes beyond the SDK's enumerations (its own models and voices answer): only
# values of the wrong type are invalid there.
OPEN_NAMES = {"model", "voice"}
# Payloads rather than settings: checked for their type here, their content elsewhere.
NOT_DEEPER = {"response.input", "session.prompt.variables.k", "response.prompt.variables.k"}

WRONG_TYPES: list[Any] = [5, 1.5, "x", True, [], {}]


def members(annotation: Any) -> list[Any]:
    """The alternatives of a (possibly Optional, Annotated, aliased) annotation."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in members(arg)]
    return [annotation]


def accepts(annotation: Any, value: Any) -> bool:
    """Whether ``value`` has a JSON type (or literal value) the annotation allows."""
    for m in members(annotation):
        origin = typing.get_origin(m)
        if m is object or m is Any:
            return True
        if origin is typing.Literal:
            if value in typing.get_args(m) and type(value) is type(typing.get_args(m)[0]):
                return True
        elif origin is list or m is list:
            if isinstance(value, list):
                return True
        elif origin is dict or m is dict or (isinstance(m, type) and issubclass(m, BaseModel)):
            if isinstance(value, dict):
                return True
        elif m is type(None):
            if value is None:
                return True
        elif m is float:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return True
        elif m in (int, str, bool) and type(value) is m:
            return True
    return False


def sample(annotation: Any) -> Any:
    """A valid value, for the required fields around the one being fuzzed."""
    m = members(annotation)[0]
    if typing.get_origin(m) is typing.Literal:
        return typing.get_args(m)[0]
    if isinstance(m, type) and issubclass(m, BaseModel):
        return base_of(m)
    return {str: "x", int: 1, float: 0.5, bool: True}.get(m, "x")


def base_of(model: type[BaseModel]) -> dict[str, Any]:
    """A model's required fields (its discriminating type included) with valid values."""
    base = {}
    for name, info in model.model_fields.items():
        literal = members(info.annotation)[0]
        if info.is_required() or (name == "type" and typing.get_origin(literal) is typing.Literal):
            base[name] = sample(info.annotation)
    return base


def invalid(annotation: Any, path: str, name: str) -> Iterator[tuple[str, Any]]:
    """(path of the field refused, value to send at ``path``) for every invalid value of the field."""
    for value in WRONG_TYPES:
        if not accepts(annotation, value) and not (name in OPEN_NAMES and isinstance(value, str)):
            yield path, value
    literals = [m for m in members(annotation) if typing.get_origin(m) is typing.Literal]
    if literals and name not in OPEN_NAMES and not accepts(annotation, "bogus"):
        yield path, "bogus"
    if path in NOT_DEEPER:
        return
    for m in members(annotation):
        origin = typing.get_origin(m)
        if isinstance(m, type) and issubclass(m, BaseModel):
            base = base_of(m)
            for field, info in m.model_fields.items():
                if field in SKIPPED:
                    continue
                for where, value in invalid(info.annotation, f"{path}.{field}", field):
                    yield where, {**base, field: value}
        elif origin is list:
            (item,) = typing.get_args(m)
            for where, value in invalid(item, f"{path}[0]", name):
                yield where, [value]
        elif origin is dict:
            for where, value in invalid(typing.get_args(m)[1], f"{path}.k", name):
                yield where, {"k": value}


def cases(model: type[BaseModel], root: str) -> list[tuple[str, dict[str, Any]]]:
    """(path refused, body) for every field of ``model``: the body holds the invalid value, nested."""
    out = []
    base = base_of(model)
    for field, info in model.model_fields.items():
        if field in SKIPPED:
            continue
        for where, value in invalid(info.annotation, f"{root}.{field}", field):
            out.append((where, {**base, field: value}))
    return out


# What types cannot say: ranges, empty strings that are not "absent", OpenAI's metadata limits.
GA_SESSION = {"type": "realtime"}
EXTRA_SESSION = [
    ("session.audio.input.turn_detection.threshold", {"audio": {"input": {"turn_detection": {"threshold": 1.5}}}}),
    ("session.audio.input.turn_detection.silence_duration_ms",
     {"audio": {"input": {"turn_detection": {"silence_duration_ms": -1}}}}),
    ("session.audio.input.turn_detection.type", {"audio": {"input": {"turn_detection": {"type": ""}}}}),
    ("session.audio.input.turn_detection.idle_timeout_ms",
     {"audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 0}}}}),
    ("session.audio.input.transcription.model", {"audio": {"input": {"transcription": {"model": ""}}}}),
    ("session.audio.input.transcription.language", {"audio": {"input": {"transcription": {"language": ""}}}}),
    ("session.audio.input.noise_reduction.type", {"audio": {"input": {"noise_reduction": {"type": ""}}}}),
    ("session.audio.input.noise_reduction.strength", {"audio": {"input": {"noise_reduction": {"strength": 2}}}}),
    ("session.audio.input.format.rate", {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}),
    ("session.audio.output.speed", {"audio": {"output": {"speed": 0}}}),
    ("session.audio.output.voice", {"audio": {"output": {"voice": ""}}}),
    ("session.audio.output.voice.id", {"audio": {"output": {"voice": {"id": ""}}}}),
    ("session.output_modalities", {"output_modalities": []}),
    ("session.max_output_tokens", {"max_output_tokens": 0}),
    ("session.model", {"model": ""}),
    ("session.prompt.id", {"prompt": {"id": ""}}),
    ("session.truncation", {"truncation": ""}),
    ("session.truncation.retention_ratio", {"truncation": {"type": "retention_ratio", "retention_ratio": 2}}),
    ("session.type", {"type": ""}),
]
EXTRA_RESPONSE_GA = [
    ("response.conversation", {"conversation": ""}),
    ("response.conversation", {"conversation": "conv_other"}),
    ("response.output_modalities", {"output_modalities": []}),
    ("response.max_output_tokens", {"max_output_tokens": 0}),
    ("response.audio.output.voice", {"audio": {"output": {"voice": ""}}}),
    ("response.metadata", {"metadata": {f"k{i}": "v" for i in range(17)}}),
    ("response.metadata", {"metadata": {"k" * 65: "v"}}),
    ("response.metadata.k", {"metadata": {"k": "v" * 513}}),
    ("response.prompt.id", {"prompt": {"id": ""}}),
]
EXTRA_RESPONSE_BETA = [
    ("response.temperature", {"temperature": 0.1}),
    ("response.voice", {"voice": ""}),
    ("response.modalities", {"modalities": []}),
    ("response.max_response_output_tokens", {"max_response_output_tokens": 5000}),
]

# A realtime session's fields sent to a transcription session: of no use there, still checked.
REALTIME_FIELDS_IN_TRANSCRIPTION = [(path, {**body, "type": "transcription"})
                                    for path, body in cases(RealtimeSessionCreateRequest, "session")
                                    if path != "session.type" and not path.startswith("session.audio.input")]
BAD_TOOL_CHOICES: list[Any] = ["", {}, [], 0, False, "bogus", {"type": "function"}, {"type": "function", "name": ""}]

SESSION_CASES = [
    *[(Dialect.GA, "session.update", path, body) for path, body in cases(RealtimeSessionCreateRequest, "session")],
    *[(Dialect.GA, "session.update", path, body) for path, body in REALTIME_FIELDS_IN_TRANSCRIPTION],
    *[(Dialect.GA, "session.update", "session.tool_choice", {**GA_SESSION, "tool_choice": choice})
      for choice in BAD_TOOL_CHOICES],
    *[(Dialect.GA, "session.update", "session.tool_choice", {"type": "transcription", "tool_choice": choice})
      for choice in BAD_TOOL_CHOICES],
    *[(Dialect.BETA, "session.update", "session.tool_choice", {"tool_choice": choice}) for choice in BAD_TOOL_CHOICES],
    *[(Dialect.GA, "session.update", path, body)
      for path, body in cases(RealtimeTranscriptionSessionCreateRequest, "session")],
    *[(Dialect.GA, "session.update", path, {**GA_SESSION, **body}) for path, body in EXTRA_SESSION],
    *[(Dialect.BETA, "session.update", path, body) for path, body in cases(BetaSession, "session")],
    *[(Dialect.BETA, "transcription_session.update", path, body)
      for path, body in cases(BetaTranscriptionSession, "session")],
]
RESPONSE_CASES = [
    *[(Dialect.GA, path, body) for path, body in cases(RealtimeResponseCreateParams, "response")],
    *[(Dialect.GA, path, body) for path, body in EXTRA_RESPONSE_GA],
    *[(Dialect.GA, "response.tool_choice", {"tool_choice": choice}) for choice in BAD_TOOL_CHOICES],
    *[(Dialect.BETA, path, body) for path, body in cases(BetaResponse, "response")],
    *[(Dialect.BETA, path, body) for path, body in EXTRA_RESPONSE_BETA],
]


def problem(session: Session, event: dict[str, Any], path: str) -> str | None:
    """What is wrong with the session's answer to ``event``, which must be refused naming ``path``."""
    effects = session.handle(orjson.dumps({**event, "event_id": "fuzz"}))
    error = effects[0].event.get("error") if len(effects) == 1 and isinstance(effects[0], SendEvent) else None
    if error is None:
        return f"{path}: accepted {event}"
    param = error["param"] or ""
    if error["type"] != "invalid_request_error" or error["event_id"] != "fuzz":
        return f"{path}: {error}"
    if not (param == path or param.startswith((path + ".", path + "["))):
        return f"{path}: refused naming {param!r} instead: {event}"
    return None


def test_the_fuzzer_covers_the_fields():
    """The SDK walk reaches the nested fields, so a new SDK field is fuzzed without a test edit."""
    paths = {path for _, _, path, _ in SESSION_CASES} | {path for _, path, _ in RESPONSE_CASES}
    for path in ("session.audio.input.turn_detection.eagerness", "session.audio.input.noise_reduction.type",
                 "session.audio.input.transcription.keywords[0]", "session.prompt.variables.k",
                 "session.truncation.token_limits.post_instructions", "session.input_audio_transcription.prompt",
                 "response.metadata.k", "response.audio.output.format.type", "response.reasoning.effort"):
        assert path in paths
    assert len(SESSION_CASES) + len(RESPONSE_CASES) > 300


def test_an_invalid_session_field_is_refused_and_changes_nothing():
    config = make_config()
    problems = []
    for dialect, kind, path, body in SESSION_CASES:
        session = Session(config, dialect)
        before = copy.deepcopy(session.settings)
        problems.append(problem(session, {"type": kind, "session": body}, path))
        if session.settings != before:
            problems.append(f"{path}: the session changed: {body}")
    assert [p for p in problems if p] == []


def test_an_invalid_response_field_is_refused_and_starts_nothing():
    config = make_config()
    problems = []
    for dialect, path, body in RESPONSE_CASES:
        session = Session(config, dialect)
        before = copy.deepcopy(session.settings)
        problems.append(problem(session, {"type": "response.create", "response": body}, path))
        if session.responses.active is not None or session.conversation.items() or session.settings != before:
            problems.append(f"{path}: the session changed: {body}")
        # The same session still answers a valid request.
        if not any(isinstance(e, StartResponse) for e in session.handle(orjson.dumps({"type": "response.create"}))):
            problems.append(f"{path}: no response after the refusal")
    assert [p for p in problems if p] == []


def fields(*models: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for model in models for name in model.model_fields)


def test_the_fields_taken_are_the_sdks():
    """Exactly OpenAI's names are taken, so a field OpenAI refuses is refused here and none it takes is."""
    assert settings.GA_FIELDS["session"] == fields(RealtimeSessionCreateRequest,
                                                   RealtimeTranscriptionSessionCreateRequest)
    assert settings.BETA_FIELDS == fields(BetaSession)
    assert settings.BETA_TRANSCRIPTION_FIELDS == fields(BetaTranscriptionSession)
    assert FIELDS[Dialect.GA].names["response"] == fields(RealtimeResponseCreateParams)
    assert FIELDS[Dialect.BETA].names["response"] == fields(BetaResponse)


# A beta session's fields sent in the GA shape: the usual migration mistake, which OpenAI refuses.
UNKNOWN_FIELDS = [
    (Dialect.GA, {"type": "session.update", "session": {"type": "realtime", "input_audio_format": "g711_ulaw"}},
     "session.input_audio_format"),
    (Dialect.GA, {"type": "session.update", "session": {"type": "realtime", "modalities": ["text"]}},
     "session.modalities"),
    (Dialect.GA, {"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}},
                                                                  "speaker": {}}}}, "session.audio.speaker"),
    (Dialect.GA, {"type": "session.update", "session": {"audio": {"output": {"voice": "echo", "temperature": 1}}}},
     "session.audio.output.temperature"),
    (Dialect.BETA, {"type": "session.update", "session": {"output_modalities": ["text"]}},
     "session.output_modalities"),
    (Dialect.BETA, {"type": "transcription_session.update", "session": {"voice": "echo"}}, "session.voice"),
    (Dialect.GA, {"type": "response.create", "response": {"modalities": ["text"]}}, "response.modalities"),
    (Dialect.GA, {"type": "response.create", "response": {"audio": {"output": {"speed": 2}}}},
     "response.audio.output.speed"),
    (Dialect.BETA, {"type": "response.create", "response": {"output_modalities": ["text"]}},
     "response.output_modalities"),
]


@pytest.mark.parametrize(("dialect", "event", "path"), UNKNOWN_FIELDS, ids=[p for _, _, p in UNKNOWN_FIELDS])
def test_a_field_of_no_such_name_is_refused_naming_it(dialect: Dialect, event: dict[str, Any], path: str):
    session = Session(make_config(), dialect)
    before = copy.deepcopy(session.settings)
    (effect,) = session.handle(orjson.dumps({**event, "event_id": "fuzz"}))
    assert isinstance(effect, SendEvent)
    assert (effect.event["error"]["code"], effect.event["error"]["param"]) == ("unknown_parameter", path)
    assert session.settings == before and session.responses.active is None


def test_a_ga_session_takes_no_beta_transcription_update():
    session = Session(make_config(), Dialect.GA)
    (effect,) = session.handle(orjson.dumps({"type": "transcription_session.update", "session": {}}))
    assert isinstance(effect, SendEvent) and effect.event["error"]["code"] == "invalid_event_type"
    assert session.settings.type == "realtime"


# Where an id is expected, "" is an id that names nothing, not an absent one.
EMPTY_IDS = [
    ({"type": "conversation.item.create", "previous_item_id": "",
      "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
     "previous_item_id"),
    ({"type": "conversation.item.create",
      "item": {"id": "", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
     "item.id"),
    ({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "", "output": "x"}},
     "item.call_id"),
    ({"type": "conversation.item.create",
      "item": {"type": "mcp_approval_response", "approval_request_id": "", "approve": True}},
     "item.approval_request_id"),
    ({"type": "conversation.item.retrieve", "item_id": ""}, "item_id"),
    ({"type": "conversation.item.delete", "item_id": ""}, "item_id"),
    ({"type": "conversation.item.truncate", "item_id": "", "content_index": 0, "audio_end_ms": 0}, "item_id"),
    ({"type": "response.cancel", "response_id": ""}, "response_id"),
]


def test_an_empty_string_where_an_id_is_expected_is_refused():
    config = make_config()
    problems = []
    for event, path in EMPTY_IDS:
        session = Session(config)
        session.handle(orjson.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "first"}]}}))
        before = [item.data for item in session.conversation.items()]
        problems.append(problem(session, event, path))
        effects = session.handle(orjson.dumps({**event, "event_id": "again"}))
        if effects[0].event.get("error", {}).get("code") != "invalid_value":
            problems.append(f"{path}: refused as {effects[0]}, not as an empty value")
        if [item.data for item in session.conversation.items()] != before:
            problems.append(f"{path}: the conversation changed: {event}")
    assert [p for p in problems if p] == []
