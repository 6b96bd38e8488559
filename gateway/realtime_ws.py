"""Deprecated: the Realtime WebSocket endpoint moved to gateway.transports.websocket (this name goes in the
next release)."""

import warnings

from gateway.transports.websocket import RealtimeEndpoint, realtime_route

warnings.warn("gateway.realtime_ws moved to gateway.transports.websocket; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)

__all__ = ["RealtimeEndpoint", "realtime_route"]
