"""The front door's checks on every HTTP request: Host, Origin and CORS, request targets, security headers.

An ASGI middleware in front of the whole app. The WebSocket endpoint checks a browser's Origin itself
(gateway/transports/realtime_websocket.py, with the same ``Origins``), so it stays safe when mounted in another app.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.realtime.events import new_id
from gateway.runtime.auth import error_body

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# A longer request target is refused with 414, more header bytes with 431 (the server's protocol refuses a
# head still incomplete past its own bound, but takes a longer one that arrives in one read); so are more
# headers or longer header lines than [server] max_request_headers and max_header_line_bytes (head_problem).
MAX_TARGET_CHARS = 2048
MAX_HEADER_BYTES = 16 * 1024
# What the OpenAI SDKs send from a browser (fetch preflights name them); any other requested header is
# allowed too once the origin is: the origin is the check, not the header names.
CORS_HEADERS = "Authorization, Content-Type, OpenAI-Beta, X-OpenAI-Agents-SDK, OpenAI-Organization, OpenAI-Project"
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    # The page and its modules and worklets come from here, and it talks only to here ('self' covers ws:
    # and wss: to the same host); no other site may frame it.
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; media-src 'self' blob:; "
                                 b"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
]


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(netloc: str) -> str:
    """The host of a Host header or URL authority, without port or IPv6 brackets, lower case."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def _names(setting: str) -> list[str]:
    return [part.strip().lower().rstrip("/") for part in setting.split(",") if part.strip()]


class Origins:
    """``[server] allowed_origins``: the web pages that may call the gateway from a browser.

    Empty: the gateway's own origin (the Origin's host and port are the request's Host) and pages on
    localhost. Otherwise a comma-separated list of origins ("https://app.example.com"), or "*" for any.
    A request with no Origin header does not come from a web page and is not checked here."""

    def __init__(self, setting: str) -> None:
        self.listed = _names(setting)
        self.any = "*" in self.listed

    def allows(self, origin: str, host: str | None) -> bool:
        origin = origin.strip().lower().rstrip("/")
        if self.any or origin in self.listed:
            return True
        if self.listed:
            return False
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (a sandboxed or file:// page) and anything odd
        return parts.netloc == (host or "").strip().lower() or host_name(parts.netloc) in LOOPBACK_NAMES


class Hosts:
    """``[server] allowed_hosts``: the names the gateway answers to (against DNS rebinding).

    Empty: on a loopback address only loopback names (localhost, 127.0.0.1, ::1, any port); on any other
    address any name (authentication is required there). Otherwise a comma-separated list of names,
    "*.example.com" for a domain's subdomains, or "*" for any; loopback names are taken besides (a page a
    rebinding attack serves sends its own name, never those, and a health probe inside the host or
    container sends them)."""

    def __init__(self, setting: str, bind_host: str) -> None:
        self.listed = _names(setting)
        self.loopback_only = not self.listed and is_loopback(bind_host)

    def allows(self, host_header: str | None) -> bool:
        if not self.listed:
            return not self.loopback_only or host_name(host_header or "") in LOOPBACK_NAMES
        name = host_name(host_header or "")
        return name in LOOPBACK_NAMES or any(
            pattern == "*" or name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:]))
            for pattern in self.listed
        )


def head_problem(headers: list[tuple[bytes, bytes]], target: bytes, max_headers: int,
                 max_line_bytes: int) -> tuple[int, str, str] | None:
    """Why a request head is refused: (HTTP status, message, error code), or None. The one check of a head's
    bounds and its Host headers, for HTTP requests here and for WebSocket upgrades before uvicorn hands them to
    the websockets library (gateway/server/protocols/http_protocol.py)."""
    if len(headers) > max_headers:
        return 431, f"The request has too many headers (at most {max_headers}).", "headers_too_large"
    total = hosts = 0
    for name, value in headers:
        size = len(name) + len(value)
        if size + 2 > max_line_bytes:
            return 431, f"A request header line is too long (at most {max_line_bytes} bytes).", "headers_too_large"
        total += size
        hosts += name == b"host"
    if total > MAX_HEADER_BYTES:
        return 431, f"The request headers are too large (at most {MAX_HEADER_BYTES} bytes).", "headers_too_large"
    if hosts > 1:  # which one names the site is ambiguous (RFC 9112, 3.2: a 400)
        return 400, "The request has more than one Host header.", "invalid_host"
    if len(target) > MAX_TARGET_CHARS:
        return 414, f"The request target is too long (at most {MAX_TARGET_CHARS} bytes).", "uri_too_long"
    return None


async def _refuse(send: Send, status: int, message: str, code: str) -> None:
    body = error_body(message, code)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class FrontDoor:
    """Refuses what no handler should see, answers CORS preflights, and adds the response headers."""

    def __init__(self, app: ASGIApp, origins: Origins, hosts: Hosts, max_headers: int,
                 max_header_line_bytes: int) -> None:
        self.app = app
        self.origins = origins
        self.hosts = hosts
        self.max_headers = max_headers
        self.max_header_line_bytes = max_header_line_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        answer = send if scope["type"] == "http" else _denial(send)
        query = scope["query_string"]
        target = scope["raw_path"] + (b"?" + query if query else b"")
        problem = head_problem(scope["headers"], target, self.max_headers, self.max_header_line_bytes)
        if problem is not None:
            await _refuse(answer, *problem)
            return
        host = headers.get("host")
        if host is None and scope["http_version"] == "1.1":
            await _refuse(answer, 400, "The request has no Host header.", "invalid_host")
            return
        if not self.hosts.allows(host):
            await _refuse(answer, 400, "Invalid host header.", "invalid_host")
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)  # the endpoint checks the Origin itself
            return
        if any(c < " " for c in scope["path"]):
            await _refuse(send, 400, "The path has a control character.", "invalid_path")
            return
        origin = headers.get("origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None:
            if not self.origins.allows(origin, headers.get("host")):
                await _refuse(send, 403, "This origin may not call the gateway ([server] allowed_origins).",
                              "origin_not_allowed")
                return
            cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin"),
                    (b"access-control-expose-headers", b"Location, x-request-id")]
            if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                requested = headers.get("access-control-request-headers")
                allowed = CORS_HEADERS + (", " + requested if requested else "")
                cors += [(b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
                         (b"access-control-allow-headers", allowed.encode("latin-1")),
                         (b"access-control-max-age", b"600"), (b"content-length", b"0")]
                await send({"type": "http.response.start", "status": 204, "headers": cors + SECURITY_HEADERS})
                await send({"type": "http.response.body", "body": b""})
                return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                response_headers = MutableHeaders(scope=message)
                for name, value in cors + SECURITY_HEADERS:
                    response_headers.append(name.decode(), value.decode("latin-1"))
                # As OpenAI's answers carry: the SDKs report it (LiveKit warns on each answer without one).
                response_headers.append("x-request-id", new_id("req"))
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _denial(send: Send) -> Send:
    """``send`` for an HTTP response that refuses a WebSocket handshake (the ASGI denial-response extension)."""

    async def deny(message: Message) -> None:
        await send({**message, "type": "websocket." + message["type"]})

    return deny
