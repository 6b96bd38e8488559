"""What the protocol cores share, without I/O: the effects every core returns (effects.py), ids, the reading of
client values (values.py), the turn detectors (vad.py, and semantic_vad.py with the Smart Turn
model's verdicts) and the responder interface (responder.py: what a runner asks of STT, the LLM and TTS).

The Realtime core (gateway/realtime/) is built on these, and so is any other protocol's core beside it; none of
them forks them. Like the cores, nothing here opens a socket, starts a task, reads a clock or loads a model.
"""
