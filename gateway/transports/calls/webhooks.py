"""Webhooks signed the Standard Webhooks way, as OpenAI signs them, so ``client.webhooks.unwrap`` of the
``openai`` SDK verifies them: ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature``
(``v1,`` + base64 HMAC-SHA256 of ``"{id}.{timestamp}.{body}"`` keyed with the base64 key of a ``whsec_``
secret).

Each event goes to every configured URL at once, each with its own timeout and no retry: a call's
decision cannot wait for a receiver that failed. A receiver that hangs, refuses or fails costs a log line
(rate-limited: gateway.log_repeats), never the call.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import logging
import secrets
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from gateway.config import ConfigError

log = logging.getLogger(__name__)

SECRET_PREFIX = "whsec_"
MIN_KEY_BYTES, MAX_KEY_BYTES = 24, 64
# What is read of a receiver's answer (its status is all that matters).
MAX_ANSWER_BYTES = 4096


def decode_secret(value: str, env_name: str) -> bytes:
    """The signing key of a ``whsec_`` secret; ConfigError naming the variable when it is not one."""
    if not value.startswith(SECRET_PREFIX):
        raise ConfigError(f"environment variable {env_name}: a webhook secret starts with '{SECRET_PREFIX}' (make one: "
                          "python -c 'import base64,secrets; print(\"whsec_\" + "
                          "base64.b64encode(secrets.token_bytes(32)).decode())')")
    try:
        key = base64.b64decode(value[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"environment variable {env_name}: the part after '{SECRET_PREFIX}' is not base64") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ConfigError(f"environment variable {env_name}: the key must be {MIN_KEY_BYTES}-{MAX_KEY_BYTES} bytes, "
                          f"got {len(key)}")
    return key


def signature(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signed_headers(key: bytes, body: bytes, now: float | None = None) -> dict[str, str]:
    webhook_id = "wh_" + secrets.token_hex(12)
    timestamp = int(time.time() if now is None else now)
    return {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(key, webhook_id, timestamp, body), "content-type": "application/json"}


def check_url(url: str) -> str:
    """A receiver's URL: https, or http to a loopback address (a webhook carries the caller's number)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname:
        try:
            if ipaddress.ip_address(parts.hostname).is_loopback:
                return url
        except ValueError:
            if parts.hostname == "localhost":
                return url
    raise ConfigError(f"option calls.webhook_urls: {url!r} must be https:// (or http:// to a loopback address)")


class Webhooks:
    """The configured receivers and the key events are signed with."""

    def __init__(self, urls: list[str], key: bytes, timeout_s: float) -> None:
        self.urls = [check_url(u) for u in urls]
        self._key = key
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def deliver(self, event: dict[str, Any]) -> int:
        """Send ``event`` to every receiver; how many answered 2xx."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        body = orjson.dumps(event)
        results = await asyncio.gather(*(self._post(url, body) for url in self.urls))
        return sum(results)

    async def _post(self, url: str, body: bytes) -> bool:
        assert self._session is not None
        try:
            async with self._session.post(url, data=body, headers=signed_headers(self._key, body),
                                          allow_redirects=False) as answer:
                await answer.content.read(MAX_ANSWER_BYTES)
                if 200 <= answer.status < 300:
                    return True
                log.warning("webhook %s answered HTTP %d", url, answer.status)
        except TimeoutError:
            log.warning("webhook %s did not answer in time ([calls] webhook_timeout_s)", url)
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("webhook %s failed: %s", url, exc or type(exc).__name__)
        return False

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
