"""Realtime voice gateway: the OpenAI Realtime protocol over WebSocket, in front of STT, an LLM and TTS."""

__version__ = "0.1.0"
