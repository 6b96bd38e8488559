"""What answers, and whether its backends do: /healthz's report, the page's banner, and /readyz's option.

The backends are the parts of the responder and the transcriber: the STT, the LLM and the TTS engine. One
that runs in this process (the local models, piper, the Qwen3-TTS engine in a thread) is up while the
process is. One that is reached over the network or IPC (an OpenAI-compatible server, engine processes)
has a ``check()`` (None when it answers, else the cause in a few words, no address) and a ``where`` (its
address, for the log only): it is checked at start, every [server] backend_check_s, and at once when a
turn failed on it. The log says when one stops answering and when it answers again, once each.

/healthz is public: it names models, never a backend's address or key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from gateway.core.responder import Responder, Transcriber
from gateway.responders.echo import EchoResponder
from gateway.responders.pipeline import PipelineResponder
from gateway.responders.remote import LlmClient

log = logging.getLogger(__name__)

# A turn's failure asks for a check at once, but not more often than this.
MIN_RECHECK_S = 1.0


def model_name(part: object) -> str | None:
    """A model's name as its part declares it (``model_name``; a remote client's ``model``)."""
    name = getattr(part, "model_name", None) or getattr(part, "model", None)
    return name if isinstance(name, str) else None


def responder_kind(responder: Responder) -> str:
    """"local" (the in-process demo models), "pipeline" (an LLM server), "echo", or the class name of a
    responder given in code."""
    if isinstance(responder, EchoResponder):
        return "echo"
    if isinstance(responder, PipelineResponder):
        return "pipeline" if isinstance(responder.llm, LlmClient) else "local"
    return type(responder).__name__


def parts_of(responder: Responder, transcriber: Transcriber | None) -> dict[str, object]:
    """The backends by role: stt, llm, tts (those this responder has)."""
    parts: dict[str, object] = {"stt": transcriber} if transcriber is not None else {}
    if isinstance(responder, PipelineResponder):
        parts |= {"llm": responder.llm, "tts": responder.tts_engine}
    return parts


def describe_responder(responder: Responder | None, transcriber: Transcriber | None) -> dict[str, Any] | None:
    """What answers, for the page's banner: the kind and the models' names; None while starting."""
    if responder is None:
        return None
    parts = parts_of(responder, transcriber)
    names = {role: model_name(part) for role, part in parts.items()}
    # The voices a session may choose that sound different: the engine's names, or None when it has one voice
    # (piper, the tone engine: any name is taken, all sound the same) or no speech at all (echo).
    voices = getattr(parts.get("tts"), "voices", None)
    return {"kind": responder_kind(responder), "models": {role: name for role, name in names.items() if name},
            "voices": sorted(voices) if voices is not None else None}


def summary(responder: Responder, transcriber: Transcriber | None) -> str:
    """One phrase for the log: "local (whisper tiny.en, SmolLM2-135M-Instruct, piper en_US-joe-medium)"."""
    described = describe_responder(responder, transcriber) or {}
    models = ", ".join(f"{role} {name}" for role, name in described.get("models", {}).items())
    return f"{described.get('kind')}" + (f" ({models})" if models else "")


@dataclass
class BackendHealth:
    model: str | None
    remote: bool  # reached over the network or IPC, and so checked
    reachable: bool | None = None  # None: not checked yet
    latency_ms: float | None = None  # the last check's round trip
    last_error: str | None = None  # the last check's failure, kept after it answers again
    checked_at: float | None = None  # wall-clock time of the last check

    def wire(self) -> dict[str, Any]:
        return {"model": self.model, "remote": self.remote, "reachable": self.reachable,
                "latency_ms": self.latency_ms, "last_error": self.last_error,
                "checked_at": None if self.checked_at is None else round(self.checked_at, 3)}


class Backends:
    """The backends' health; ``run`` keeps it current until cancelled."""

    def __init__(self, responder: Responder, transcriber: Transcriber | None, interval_s: float) -> None:
        self._parts = parts_of(responder, transcriber)
        self.interval_s = interval_s
        self.health = {role: BackendHealth(model_name(part), callable(getattr(part, "check", None)))
                       for role, part in self._parts.items()}
        for health in self.health.values():
            if not health.remote:
                health.reachable = True  # it runs in this process
        self._wake = asyncio.Event()
        self._last_check = 0.0

    def wire(self) -> dict[str, dict[str, Any]]:
        return {role: health.wire() for role, health in self.health.items()}

    def unreachable(self) -> list[str]:
        """The roles whose last check failed."""
        return [role for role, health in self.health.items() if health.reachable is False]

    def failed(self, role: str) -> None:
        """A turn failed on this backend: check it now (the next turn, /healthz and the page then know)."""
        if role in self.health and self.health[role].remote:
            self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._last_check = loop.time()
            await self.check()
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s if self.interval_s > 0 else None)
            except TimeoutError:
                pass
            self._wake.clear()
            await asyncio.sleep(max(0.0, self._last_check + MIN_RECHECK_S - loop.time()))

    async def check(self) -> None:
        """Check every remote backend once, side by side."""
        remote = [role for role, health in self.health.items() if health.remote]
        await asyncio.gather(*(self._check(role) for role in remote))

    async def _check(self, role: str) -> None:
        part, health = self._parts[role], self.health[role]
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            problem = await part.check()  # type: ignore[attr-defined]
        except Exception as exc:  # a check must not end the loop that runs it
            problem = f"{type(exc).__name__}: {exc}"[:200]
        health.latency_ms = round((loop.time() - started) * 1000, 1)
        health.checked_at = time.time()
        was = health.reachable
        health.reachable = problem is None
        where = getattr(part, "where", "?")
        if problem is not None:
            health.last_error = problem
            if was is not False:
                log.warning("%s backend at %s is not reachable: %s; turns will fail until it answers",
                            role, where, problem)
        elif was is False:
            log.info("%s backend at %s answers again", role, where)
