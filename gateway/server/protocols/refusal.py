"""A whole HTTP response written straight to a connection the server is about to close, for the refusals
made below the app (uvicorn's protocols): an OpenAI-shaped error body, as the app's own refusals have."""

from __future__ import annotations

import http

from gateway.runtime.auth import error_body


def raw_response(status: int, message: str, code: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    body = error_body(message, code)
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", "content-type: application/json",
             f"content-length: {len(body)}", "connection: close", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
