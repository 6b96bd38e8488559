"""uvicorn's HTTP (h11) and WebSocket (websockets sans-I/O) protocol classes, with the gateway's limits."""
