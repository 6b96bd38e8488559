"""Ids of the things a session makes (events, items, responses, sessions): a prefix and 80 random bits in hex."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"
