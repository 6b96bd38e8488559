"""What the HTTP routes share: OpenAI-shaped errors, bounded request bodies, the credential check."""

from __future__ import annotations

import re
from typing import Any

from starlette.datastructures import FormData, UploadFile
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.core.values import parse_json
from gateway.realtime.events import ProtocolError
from gateway.runtime.auth import AuthError, Credential, bearer, error_body
from gateway.runtime.gateway import Gateway
from gateway.runtime.voices.library import Upload

# A form's fields besides its files: names, a description, a transcript, a prompt.
MAX_FIELD_BYTES = 64 * 1024
OBJECT_FIELD = re.compile(r"(\w+)\[(\w+)\]")


class HttpError(Exception):
    """A refusal the app answers with ``status`` and an OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, code: str | None, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param, self.kind = status, code, param, kind
        self.headers = headers


def error_response(status: int, message: str, code: str | None, kind: str = "invalid_request_error",
                   param: str | None = None, headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(message, code, kind, param), status, headers, media_type="application/json")


def http_error_response(exc: HttpError) -> Response:
    return error_response(exc.status, str(exc), exc.code, exc.kind, exc.param, exc.headers)


def authorize(request: Request, gateway: Gateway, secrets_allowed: bool = False) -> Credential:
    """The request's credential (``Authorization: Bearer``); 401 if it is refused."""
    try:
        return gateway.auth.check(bearer(request.headers.get("authorization")), secrets_allowed)
    except AuthError as exc:
        raise HttpError(401, str(exc), "invalid_api_key") from None


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused with 413 past ``limit`` bytes (before reading it, when Content-Length says so)."""
    try:
        declared = int(request.headers.get("content-length", "0"))
    except ValueError:
        raise HttpError(400, "The Content-Length header is not a number.", "invalid_request") from None
    if declared > limit:
        raise HttpError(413, f"The body is too large (at most {limit} bytes).", "body_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"The body is too large (at most {limit} bytes).", "body_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise HttpError(400, "The client went away while sending the body.", "client_disconnected") from None
    body = b"".join(chunks)
    request._body = body  # noqa: SLF001 - Starlette's own cache: request.form() reads the body from here
    return body


async def read_json_object(request: Request, limit: int) -> dict[str, Any]:
    body = await read_body(request, limit)
    return json_object(body, "The body", "invalid_json") if body.strip() else {}


def json_object(text: bytes | str, what: str, not_object_code: str) -> dict[str, Any]:
    """A JSON object a client sent (``what`` names it in the 400 error), or HttpError. The one parser of
    every way in (gateway.core.values.parse_json): the WebSocket's depth limit holds here too."""
    try:
        value = parse_json(text, what)
    except ProtocolError as exc:
        raise HttpError(400, exc.message, exc.code) from None
    if not isinstance(value, dict):
        raise HttpError(400, f"{what} must be a JSON object.", not_object_code)
    return value


def string_field(body: dict[str, Any], name: str, *, required: bool = False, limit: int | None = None,
                 param: str | None = None) -> str | None:
    """A JSON body's or a form's string field `name` (None when absent), or the 400 OpenAI gives, naming it as
    `param` (a nested field's path: "voice.id"; default `name`)."""
    value = body.get(name)
    param = param or name
    if value is None:
        if required:
            raise HttpError(400, f"Missing required parameter: '{param}'.", "missing_required_parameter", param)
        return None
    if not isinstance(value, str):
        raise HttpError(400, f"'{param}' must be a string.", "invalid_type", param)
    if limit is not None and len(value) > limit:
        raise HttpError(400, f"'{param}' is longer than {limit} characters ({len(value)}).", "string_above_max_length",
                        param)
    return value


async def read_form(request: Request, max_file_bytes: int, option: str, file_field: str | None) -> dict[str, Any]:
    """The request's fields: a multipart form (the SDKs') or a JSON object; an upload comes back as an Upload,
    refused with 413 past ``max_file_bytes`` (the ``option`` that sets it is named), naming ``file_field``
    when the whole body is too large."""
    try:
        body = await read_body(request, max_file_bytes + MAX_FIELD_BYTES)
    except HttpError as exc:
        if exc.status == 413 and file_field is not None:
            raise HttpError(413, f"The upload is larger than {max_file_bytes} bytes ({option}).", "file_too_large",
                            file_field) from None
        raise
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        return json_object(body, "The body", "invalid_json") if body.strip() else {}
    try:
        form: FormData = await request.form(max_files=2, max_fields=16, max_part_size=MAX_FIELD_BYTES)
    except Exception as exc:  # Starlette's parser refuses malformed and oversized parts with its own types
        raise HttpError(400, f"The multipart body cannot be read: {exc}.", "invalid_multipart") from None
    fields: dict[str, Any] = {}
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            data = await value.read()
            if len(data) > max_file_bytes:
                raise HttpError(413, f"'{name}' is larger than {max_file_bytes} bytes ({option}).", "file_too_large",
                                name)
            fields[name] = Upload(data, name)
        elif name.endswith("[]"):  # an array, a value per part (the SDKs' encoding)
            fields.setdefault(name[:-2], []).append(value)
        elif (member := OBJECT_FIELD.fullmatch(name)) is not None:  # an object, a part per member: "a[b]"
            parent = fields.setdefault(member[1], {})
            if isinstance(parent, dict):
                parent[member[2]] = value
        else:
            fields[name] = value
    await form.close()
    return fields


def upload_field(fields: dict[str, Any], name: str) -> Upload:
    """The form's file ``name``, or the 400 naming it."""
    value = fields.get(name)
    if value is None:
        raise HttpError(400, f"Missing required parameter: '{name}' (a file).", "missing_required_parameter", name)
    if not isinstance(value, Upload):
        raise HttpError(400, f"'{name}' must be a file upload (multipart/form-data).", "invalid_type", name)
    return value
