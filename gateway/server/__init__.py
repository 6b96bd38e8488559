"""Serving: uvicorn on one socket (serve.py), worker processes on one port (workers.py), the HTTP and
WebSocket protocol classes with the gateway's limits (protocols/), and local certificates (certs.py)."""
