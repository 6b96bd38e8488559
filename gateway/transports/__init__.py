"""The ways in: one ASGI app (app.py) with the Realtime WebSocket endpoint (realtime_websocket.py), WebRTC signalling
and media (webrtc/), the REST routes (client_secrets.py) and the front door's checks (guard.py, rest.py).
Each opens sessions through gateway.runtime's ``Gateway``.
"""
