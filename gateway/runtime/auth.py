"""Who may use the gateway: API keys, and the ephemeral client secrets minted with them.

``GATEWAY_API_KEYS`` (comma-separated, read once at start-up, never from config.toml) turns
authentication on. A client secret ("ek_...") is a sealed token, not a row in one process's memory:
its payload (expiry, protocol shape, kind, session configuration) is compressed and encrypted with
AES-256-GCM (``cryptography``) under a key derived from the signing key with HKDF-SHA256, so any
gateway process holding the same signing key opens it, behind a balancer too, and nobody else can
read it or change it. It must be unreadable, not only unforgeable: the browser that holds it is not
trusted with what the configuration carries (an MCP tool's ``authorization`` and ``headers``).

The signing key is ``GATEWAY_SIGNING_KEY``. Unset, it is derived from the API keys (every gateway
given the same keys shares it), or, with no keys either, drawn at random per process (a secret then
verifies only in the process that minted it; a log line says so).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gateway.config import API_KEYS_ENV, SIGNING_KEY_ENV, ConfigError
from gateway.realtime.events import Dialect

log = logging.getLogger(__name__)

SECRET_PREFIX = "ek_"
KEY_SUBPROTOCOL = "openai-insecure-api-key."
# A browser sends the secret inside its Sec-WebSocket-Protocol header, and proxies limit a header line
# (nginx: 8 KiB by default): the whole secret, configuration included, stays under this many characters.
MAX_SECRET_CHARS = 4096
DEFAULT_TTL_S = 600
MIN_TTL_S, MAX_TTL_S = 10, 7200
MIN_SIGNING_KEY_CHARS = 32
_DERIVE_LABEL = b"voice-gateway client secrets v1"
# The AES key's HKDF label: the signing key itself is never used as a cipher key.
_SEAL_LABEL = b"voice-gateway client secrets v2: AES-256-GCM"
_NONCE_BYTES = 12  # random per secret: far below GCM's 2^32 messages per key


class AuthError(Exception):
    """A credential that is refused; the message says why, in words a client can act on."""


class SecretTooLarge(ValueError):
    """The session configuration does not fit in a client secret."""


@dataclass(frozen=True)
class ClientSecret:
    """What a verified ``ek_`` secret carries: the session it opens starts from ``session``."""

    expires_at: int
    dialect: Dialect
    kind: str  # "realtime" or "transcription"
    session: dict[str, Any]
    id: str  # its nonce: no two secrets share one


@dataclass(frozen=True)
class Credential:
    """A request's verified credential: an API key (``secret`` None) or a client secret."""

    secret: ClientSecret | None = None

    @property
    def owner(self) -> str | None:
        """What a session opened with this credential records as its owner: the client secret's id (None: a key)."""
        return self.secret.id if self.secret is not None else None

    def reaches(self, owner: str | None) -> bool:
        """Whether this credential may act on a session from outside it (read its trace, hang its call up): an
        API key on any, a client secret (handed to a browser or a phone) on the session it opened only."""
        return self.secret is None or self.secret.id == owner


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Auth:
    """The process's API keys and signing key, read once at start-up."""

    def __init__(self, api_keys: Iterable[str], signing_key: bytes) -> None:
        self.api_keys = frozenset(api_keys)
        self._signing_key = signing_key
        sealing_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_SEAL_LABEL).derive(signing_key)
        self._cipher = AESGCM(sealing_key)

    def __reduce__(self) -> tuple[type[Auth], tuple[list[str], bytes]]:
        # The parent of `serve --workers N` hands its Auth to each worker (one signing key for all): sent as
        # the keys it is made from, the cipher object is made again there.
        return Auth, (sorted(self.api_keys), self._signing_key)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Auth:
        keys = sorted({k.strip() for k in env.get(API_KEYS_ENV, "").split(",") if k.strip()})
        configured = env.get(SIGNING_KEY_ENV, "")
        if configured:
            if len(configured) < MIN_SIGNING_KEY_CHARS:
                raise ConfigError(f"GATEWAY_SIGNING_KEY is too short: use at least {MIN_SIGNING_KEY_CHARS} random "
                                  "characters (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
            signing_key = configured.encode()
        elif keys:
            # Same keys, same signing key: gateways given the same GATEWAY_API_KEYS verify each other's secrets.
            signing_key = hmac.new(_DERIVE_LABEL, "\n".join(keys).encode(), hashlib.sha256).digest()
        else:
            signing_key = secrets.token_bytes(32)
            log.info("client secrets are sealed with a random key of this process (no GATEWAY_SIGNING_KEY or "
                     "GATEWAY_API_KEYS): they open only here")
        return cls(keys, signing_key)

    @property
    def required(self) -> bool:
        return bool(self.api_keys)

    def is_api_key(self, token: str) -> bool:
        # Compare against every key, in constant time each: no early exit tells which one was close.
        return any([hmac.compare_digest(token.encode(), key.encode()) for key in self.api_keys])

    def check(self, token: str | None, secrets_allowed: bool = True) -> Credential:
        """The credential ``token`` stands for; AuthError if it is refused.

        With no API keys configured every request passes, but an ``ek_`` secret is still verified: its
        configuration is what the client asked for, and a broken or expired one is refused."""
        if token and self.api_keys and self.is_api_key(token):
            return Credential()
        if token and token.startswith(SECRET_PREFIX) and secrets_allowed:
            return Credential(self.verify(token))
        if not self.api_keys:
            return Credential()
        if not token:
            raise AuthError("You didn't provide an API key. Send it as 'Authorization: Bearer <key>' (or, from a "
                            "browser WebSocket, as the subprotocol 'openai-insecure-api-key.<key>').")
        if token.startswith(SECRET_PREFIX):
            raise AuthError("A client secret cannot be used here: this endpoint needs an API key.")
        raise AuthError("Incorrect API key provided.")

    # --- client secrets ---------------------------------------------------------------------------

    def mint(self, session: dict[str, Any], dialect: Dialect, kind: str, ttl_s: int,
             now: float | None = None) -> tuple[str, int]:
        """A new ``ek_`` secret for ``session`` and its expiry (unix seconds)."""
        expires_at = int(now if now is not None else time.time()) + ttl_s
        payload = orjson.dumps({"exp": expires_at, "d": dialect.value, "k": kind, "s": session})
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._cipher.encrypt(nonce, zlib.compress(payload, 9), SECRET_PREFIX.encode())
        value = SECRET_PREFIX + _b64(nonce + sealed)
        if len(value) > MAX_SECRET_CHARS:
            raise SecretTooLarge(
                f"The session configuration is too large for a client secret ({len(value)} characters with it, "
                f"at most {MAX_SECRET_CHARS}): send long instructions or tools in a session.update instead."
            )
        return value, expires_at

    def verify(self, value: str, now: float | None = None) -> ClientSecret:
        try:
            if len(value) > MAX_SECRET_CHARS:
                raise ValueError
            raw = _unb64(value.removeprefix(SECRET_PREFIX))
        except (ValueError, binascii.Error):
            raise AuthError("Invalid client secret.") from None
        # Authenticated first: nothing of a payload this gateway did not seal is decompressed or parsed.
        try:
            payload = self._cipher.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], SECRET_PREFIX.encode())
        except (InvalidTag, ValueError):
            raise AuthError("Invalid client secret (not signed by this gateway's key).") from None
        data = orjson.loads(zlib.decompress(payload))
        if data["exp"] <= (now if now is not None else time.time()):
            raise AuthError("The client secret has expired.")
        return ClientSecret(data["exp"], Dialect(data["d"]), data["k"], data["s"], _b64(raw[:_NONCE_BYTES]))


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def error_body(message: str, code: str | None, kind: str = "invalid_request_error", param: str | None = None) -> bytes:
    """An OpenAI-shaped HTTP error body."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})
