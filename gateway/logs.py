"""The process's logging: one line per record, and the libraries' chatter kept out of a person's way.

At INFO (the default) the log says what the gateway does: its start, one line per session and one per
turn, warnings and errors. The libraries' own INFO lines (aioice's per call, the HTTP client's per
request), Python warnings from inside them (a transformers FutureWarning) and progress bars show only with
``--log-level DEBUG``.
"""

from __future__ import annotations

import logging
import os

from gateway.log_repeats import RepeatedWarnings

# Libraries whose INFO lines describe their own workings, not the gateway's.
CHATTY = ("aioice", "aiortc", "httpx", "httpx2", "huggingface_hub", "transformers", "faster_whisper", "piper",
          "mcp", "urllib3", "filelock")


def configure_logging(level: str, prefix: str = "") -> None:
    level = level.upper()
    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s")
    # Warnings and errors a client can cause over and over (gateway/log_repeats.py): one line per interval and
    # origin, and every different traceback.
    for handler in logging.getLogger().handlers:
        handler.addFilter(RepeatedWarnings())
    debug = logging.getLevelName(level) == logging.DEBUG
    # uvicorn logs a line per WebSocket handshake; the gateway logs each session itself.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.WARNING)
    # A library's warnings.warn (deprecations inside transformers or torch) become log records: shown at DEBUG.
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.DEBUG if debug else logging.ERROR)
    if not debug:
        # tqdm reads these when a bar is made (transformers' "Loading weights", the Hub's downloads): a model
        # download reports its progress as log lines instead (gateway.responders.fetch).
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
