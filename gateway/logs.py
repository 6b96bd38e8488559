"""The process's logging: one line per record, and the libraries' chatter kept out of a person's way."""

from __future__ import annotations

import logging

from gateway.log_repeats import RepeatedWarnings


def configure_logging(level: str, prefix: str = "") -> None:
    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s")
    # Warnings a client can cause over and over (gateway/log_repeats.py): one line per interval and kind.
    for handler in logging.getLogger().handlers:
        handler.addFilter(RepeatedWarnings())
    # uvicorn logs a line per WebSocket handshake; the gateway logs each session itself.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    # The openai package's HTTP client logs every request at INFO: a line per STT and LLM call of every
    # turn. The gateway logs the failed ones itself; --log-level DEBUG shows them all.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("httpx2").setLevel(logging.WARNING)
