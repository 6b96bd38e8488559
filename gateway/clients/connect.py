"""Opening a connection over the transport an endpoint names (WebSocket, or WebRTC with the webrtc extra)."""

from __future__ import annotations

from gateway.clients.connection import INSTALL_WEBRTC, TRANSPORTS, CliError, Connection, Endpoint, OnSend
from gateway.clients.websocket_connection import open_websocket


def check_transport(transport: str) -> None:
    """Fail early, before any work, when the transport's optional packages are missing."""
    if transport == "webrtc":
        try:
            import gateway.clients.webrtc_connection  # noqa: F401 - aiortc is an optional extra: is it installed?
        except ImportError as exc:
            raise CliError(f"{INSTALL_WEBRTC}; {exc}") from None


async def open_connection(endpoint: Endpoint, speed: float = 1.0, on_send: OnSend | None = None) -> Connection:
    """Connect as ``endpoint`` says; failures become CliError with the reason in plain words.

    ``speed`` paces the microphone faster than real time (WebSocket only: WebRTC audio is real time);
    ``on_send`` sees every event sent, microphone appends included.
    """
    if endpoint.transport == "webrtc":
        check_transport("webrtc")
        from gateway.clients.webrtc_connection import open_webrtc  # aiortc is an optional extra

        return await open_webrtc(endpoint, on_send)
    if endpoint.transport != "websocket":
        raise CliError(f"unknown transport {endpoint.transport!r} (expected one of {', '.join(TRANSPORTS)})")
    return await open_websocket(endpoint, speed, on_send)


