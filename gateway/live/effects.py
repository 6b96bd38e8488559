"""What a Live session asks of its runner beyond the effects every core has (gateway/core/effects.py)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from gateway.core.effects import (
    Fault,
    Mark,
    PrepareTranscript,
    RunSmartTurn,
    RunVad,
    SendEvent,
    StartResponse,
    StopResponse,
    Transcribe,
)


@dataclass(frozen=True, slots=True)
class Reflect:
    """Send this event to the session's sidebands only (the reflected input and output audio), with ``audio`` in
    its ``field`` as base64: encoded by ``wire`` only where a sideband is there to get it (most sessions have none,
    and the audio is every append and every tick)."""

    event: dict[str, Any]
    field: str
    audio: bytes

    def wire(self) -> dict[str, Any]:
        return {**self.event, self.field: base64.b64encode(self.audio).decode()}


@dataclass(frozen=True, slots=True)
class Reply:
    """Send this event (an error) to the connection whose message is being handled: the primary's go to the
    sidebands too, a sideband's only to that sideband."""

    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DelegationRequest:
    """One run of the Responses delegation's backend: the session's ``delegation.responses`` settings and the
    input the run starts from (Responses input items: messages, function calls and their outputs)."""

    model: str
    input: list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    service_tier: str | None = None


@dataclass(frozen=True, slots=True)
class RunDelegation:
    """Run the backend: pass each Responses streaming event to ``backend_event(run_id, event)``, then call
    ``backend_finished(run_id, error)``."""

    run_id: str
    request: DelegationRequest


@dataclass(frozen=True, slots=True)
class StopDelegation:
    """Stop a backend run (the session closes): no more of its events are wanted."""

    run_id: str


@dataclass(frozen=True, slots=True)
class EndSession:
    """session.closed is out: close the connections (the primary with 1000, the sidebands too)."""


Effect = (SendEvent | Reflect | Reply | RunVad | RunSmartTurn | StartResponse | StopResponse | Transcribe
          | PrepareTranscript | RunDelegation | StopDelegation | EndSession | Mark | Fault)
