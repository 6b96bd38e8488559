"""uvicorn's HTTP (httptools) and WebSocket (websockets sans-I/O) protocol classes, with the gateway's limits."""
