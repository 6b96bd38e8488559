"""One event loop's sessions: the ``Gateway`` object, each session's runner, and what they share.

The runner (session_runner.py) carries out a session's effects on the event loop: VAD and Smart Turn on
shared batched models (silero.py, smart_turn.py), responses from the responder, MCP calls (mcp_client.py),
the latency trace (trace.py). The gateway (gateway.py) admits sessions against its capacity (capacity.py)
for any transport, checks keys and client secrets (auth.py), and drains.
"""
