"""Responders the browser tests share."""
from __future__ import annotations

from gateway.responders.pipeline import BridgeSettings, PipelineResponder
from gateway.responders.remote import LlmClient
from gateway.responders.tone_tts import ToneEngine


def realtime_pipeline(llm_url: str) -> PipelineResponder:
    """An LLM server's responder with the tone engine at real time (a tone per character: audio as long as speech)."""
    return PipelineResponder(LlmClient(llm_url, "llm-test", timeout_s=5), ToneEngine(first_audio_ms=0, realtime=True),
                             BridgeSettings(10, 80))
