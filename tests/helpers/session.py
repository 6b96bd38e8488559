"""Driving a sans-I/O Session as its runner would: client events in, the effects it returns read back."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.responder import AudioOut, SpeechText
from gateway.realtime.effects import Effect, SendEvent, StartResponse
from gateway.realtime.session import Session

SECOND = bytes(48_000)  # one second of pcm16 24 kHz


def send(target: Session, **event: Any) -> list[Effect]:
    return target.handle(orjson.dumps(event))


def events_of(effects: list[Effect]) -> list[dict[str, Any]]:
    return [e.event for e in effects if isinstance(e, SendEvent)]


def start_response(session: Session) -> StartResponse:
    effects = send(session, type="response.create")
    return next(e for e in effects if isinstance(e, StartResponse))


def speak(session: Session, start: StartResponse) -> str:
    """A reply of two sentences, one second of audio each; returns the assistant item id."""
    rid = start.request.response_id
    session.response_output(rid, SpeechText("Hello there. "))
    session.response_output(rid, AudioOut(SECOND))
    session.response_output(rid, SpeechText("How are you today?"))
    session.response_output(rid, AudioOut(SECOND))
    return start.request.item_id
