"""What answers a turn: the responders, and the speech-to-text, LLM and TTS backends they speak through.

build.py is the one place where models are chosen from the config. The pipeline (pipeline.py) streams
STT → LLM → TTS; its backends are remote OpenAI-compatible servers (remote.py), the in-process demo
models (local_*.py, piper_tts.py) or the Qwen3-TTS engine (in a thread, or over IPC: engine_client.py).
"""
