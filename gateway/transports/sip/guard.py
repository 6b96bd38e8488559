"""What a source may send the SIP endpoint: the trunk's addresses, digest credentials, INVITE rates."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import OrderedDict

from aiosipua import parse_auth

NONCE_TTL_S = 300
MAX_SOURCES = 4096  # sources whose INVITE rate is remembered (least recently seen forgotten first)
ALGORITHMS = {"MD5": hashlib.md5, "SHA-256": hashlib.sha256}


class TokenBucket:
    def __init__(self, rate: float, now: float) -> None:
        self.rate, self.tokens, self.at = rate, rate, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class InviteRate:
    """New INVITEs per second, in all and per source (burst: one second's worth)."""

    def __init__(self, total: float, per_source: float) -> None:
        self.per_source = per_source
        self._total = TokenBucket(total, time.monotonic())
        self._sources: OrderedDict[str, TokenBucket] = OrderedDict()

    def allow(self, source: str) -> bool:
        now = time.monotonic()
        bucket = self._sources.pop(source, None) or TokenBucket(self.per_source, now)
        self._sources[source] = bucket
        if len(self._sources) > MAX_SOURCES:
            self._sources.popitem(last=False)
        return bucket.take(now) and self._total.take(now)


class AllowList:
    def __init__(self, setting: str) -> None:
        entries = [e.strip() for e in setting.split(",") if e.strip()]
        self.any = not entries or "*" in entries
        self.networks = [ipaddress.ip_network(e, strict=False) for e in entries if e != "*"]

    def allows(self, host: str) -> bool:
        if self.any:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)


class Digest:
    """Digest authentication of requests (RFC 3261 §22, RFC 8760): stateless nonces signed by this process."""

    def __init__(self, realm: str, username: str, password: str) -> None:
        self.realm, self.username, self.password = realm, username, password
        self._key = secrets.token_bytes(32)

    def challenges(self, stale: bool = False) -> list[str]:
        """WWW-Authenticate values: SHA-256 first, MD5 for older phones."""
        stamp = str(int(time.time()))
        nonce = stamp + "." + hmac.new(self._key, stamp.encode(), hashlib.sha256).hexdigest()[:32]
        tail = ', stale=true' if stale else ""
        return [f'Digest realm="{self.realm}", nonce="{nonce}", algorithm={name}, qop="auth"{tail}'
                for name in ("SHA-256", "MD5")]

    def check(self, authorization: str | None, method: str) -> str:
        """"ok", "stale" (a good answer to an old nonce: challenge again) or "bad"."""
        if not authorization:
            return "bad"
        try:
            params = parse_auth(authorization, credentials=True).params
        except (ValueError, IndexError):
            return "bad"
        algorithm = params.get("algorithm", "MD5").upper()
        h = ALGORITHMS.get(algorithm)
        nonce, uri, answer = params.get("nonce", ""), params.get("uri", ""), params.get("response", "")
        if h is None or params.get("username") != self.username or params.get("realm") != self.realm:
            return "bad"

        def digest(text: str) -> str:
            return h(text.encode()).hexdigest()

        ha1 = digest(f"{self.username}:{self.realm}:{self.password}")
        ha2 = digest(f"{method}:{uri}")
        if params.get("qop") == "auth":
            expected = digest(f"{ha1}:{nonce}:{params.get('nc', '')}:{params.get('cnonce', '')}:auth:{ha2}")
        else:
            expected = digest(f"{ha1}:{nonce}:{ha2}")
        if not hmac.compare_digest(expected, answer):
            return "bad"
        stamp, _, tag = nonce.partition(".")
        good = hmac.new(self._key, stamp.encode(), hashlib.sha256).hexdigest()[:32]
        if not stamp.isdigit() or not hmac.compare_digest(tag, good):
            return "bad"
        return "ok" if time.time() - int(stamp) <= NONCE_TTL_S else "stale"
