"""The GPT-Live protocol (``/v1/live/sessions``) without I/O: events in, events and effects out.

Beside gateway/realtime/, built on gateway/core/ and never importing another core. The catalogue and the error
shape (events.py), the session configuration (settings.py), the media clock and what it paces (timeline.py), the
Live-only effects (effects.py), session audio formats (audio.py), and the session itself (session.py). The runner
is gateway/runtime/live_runner.py; the endpoints gateway/transports/live_*.py.
"""
