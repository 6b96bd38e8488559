"""The OpenAI Realtime protocol without I/O: events in, events and effects out.

A ``Session`` (session.py) reads client events and returns server events and effects for a runner to
carry out (effects.py). It holds the conversation, the responses and their output items, the input
audio and its turn detection, input transcription and tools. Nothing here opens a socket, starts a task,
reads a clock or loads a model; the layers above do (gateway/runtime/).
"""
