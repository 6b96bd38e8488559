"""Serving: uvicorn on one socket (serve.py), worker processes on one port (workers.py), the HTTP and
WebSocket protocol classes with the gateway's limits (protocols/), and local certificates (certs.py).

``gateway.server`` was once the module of ``Gateway``; that name still resolves here, with a warning,
for one release: import it from ``gateway.runtime.gateway``.
"""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Gateway":
        warnings.warn("gateway.server.Gateway moved to gateway.runtime.gateway.Gateway; the old name goes in the "
                      "next release", DeprecationWarning, stacklevel=2)
        from gateway.runtime.gateway import Gateway  # the old path, kept for a release

        return Gateway
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
