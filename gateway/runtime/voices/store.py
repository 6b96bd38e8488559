"""The deployment's custom voices and their consent recordings, in a folder (``[voices] dir``).

    consents/cons_<hex>/meta.json       what the API shows, plus what the checks heard (transcript)
    consents/cons_<hex>/recording       the uploaded file, as sent
    voices/voice_<hex>/meta.json        what the API shows, plus the consent it was checked against
    voices/voice_<hex>/sample           an audio_sample voice's uploaded file, as sent (to prepare it again
                                        for another model)
    voices/voice_<hex>/<model>.voice    the voice as prepared for one model (engine VoicePrompt bytes)

Every object is written whole in ``tmp/`` (each file fsynced), then renamed into place, and its parent
fsynced: a crash leaves either the whole object or none of it (at worst a stray folder in ``tmp/``, swept
at the next start once it is an hour old). A deletion renames the object into ``trash/`` first. A file
that changes (a consent's name, a voice prepared for a new model) replaces the old one with os.replace.

Nothing is cached: every call reads the folder, so every worker process and every gateway sharing the
folder (a ReadWriteMany volume, an NFS export) sees a voice as soon as it is created and stops seeing it
once it is deleted. Creations take an exclusive lock on ``.lock`` (flock; NFSv4 carries it between hosts)
while they count, so ``max_voices`` and ``max_consents`` hold for the deployment, not per process.

The calls block (file I/O): the routes run them in a worker thread. Ids are checked against their shape
before any path is built from them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

CONSENT_PREFIX, VOICE_PREFIX = "cons_", "voice_"
ID_PATTERN = re.compile(r"^(cons|voice)_[0-9a-f]{24}$")
FILE_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
STALE_TMP_S = 3600.0
META = "meta.json"


class StoreFull(Exception):
    """The deployment holds as many objects of a kind as it may; the message says which limit."""


def default_dir() -> Path:
    """``[voices] dir`` when empty: the user's data folder ($XDG_DATA_HOME/voice-gateway/voices)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "voice-gateway" / "voices"


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def valid_id(object_id: str, prefix: str) -> bool:
    return object_id.startswith(prefix) and ID_PATTERN.match(object_id) is not None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class VoiceStore:
    def __init__(self, root: Path, max_voices: int, max_consents: int) -> None:
        self.root = root
        self.limits = {"voices": max_voices, "consents": max_consents}

    def open(self) -> None:
        """Check that the folder can be written, and sweep old leftovers of interrupted writes and deletions
        (the folders themselves are made by the first creation); OSError when it cannot be written."""
        place = self.root
        while not place.exists() and place != place.parent:
            place = place.parent
        if not place.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(place))
        if not os.access(place, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "not writable", str(place))
        now = time.time()
        for sub in ("tmp", "trash"):
            with contextlib.suppress(FileNotFoundError):
                for entry in (self.root / sub).iterdir():
                    with contextlib.suppress(OSError):
                        if sub == "trash" or now - entry.stat().st_mtime > STALE_TMP_S:
                            shutil.rmtree(entry)

    def _make_folders(self) -> None:
        # Mode 0700: the voices are the deployment's, not every local user's.
        for sub in ("consents", "voices", "tmp", "trash"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)

    # --- objects ---------------------------------------------------------------------------------

    def create(self, kind: str, meta: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
        """A new object of `kind` ("consents" or "voices") holding `meta` and `files`, made whole in tmp/
        and renamed into place; StoreFull past the kind's limit."""
        object_id = meta["id"]
        self._make_folders()
        staging = self.root / "tmp" / f"{object_id}.{secrets.token_hex(4)}"
        staging.mkdir(mode=0o700)
        try:
            for name, data in files.items():
                assert FILE_PATTERN.match(name) and name != META
                _write(staging / name, data)
            _write(staging / META, orjson.dumps(meta))
            _fsync_dir(staging)
            with self._locked():
                if self.count(kind) >= self.limits[kind]:
                    raise StoreFull(f"this deployment holds {self.limits[kind]} {kind[:-1]}s already, as many as it "
                                    f"may ([voices] max_{kind}); delete one first")
                os.rename(staging, self.root / kind / object_id)
                _fsync_dir(self.root / kind)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return meta

    def get(self, kind: str, object_id: str) -> dict[str, Any] | None:
        folder = self._folder(kind, object_id)
        if folder is None:
            return None
        try:
            return orjson.loads((folder / META).read_bytes())
        except FileNotFoundError:
            return None

    def read(self, kind: str, object_id: str, name: str) -> bytes | None:
        folder = self._folder(kind, object_id)
        if folder is None or not FILE_PATTERN.match(name):
            return None
        try:
            return (folder / name).read_bytes()
        except FileNotFoundError:
            return None

    def replace(self, kind: str, object_id: str, name: str, data: bytes) -> bool:
        """Write (or overwrite) one file of an object whole; False when the object is gone."""
        folder = self._folder(kind, object_id)
        if folder is None or not folder.is_dir():
            return False
        temp = folder / f".{name}.{secrets.token_hex(4)}"
        try:
            _write(temp, data)
            os.replace(temp, folder / name)
        except FileNotFoundError:  # deleted meanwhile
            with contextlib.suppress(OSError):
                temp.unlink()
            return False
        _fsync_dir(folder)
        return True

    def delete(self, kind: str, object_id: str) -> bool:
        folder = self._folder(kind, object_id)
        if folder is None:
            return False
        trash = self.root / "trash" / f"{object_id}.{secrets.token_hex(4)}"
        try:
            os.rename(folder, trash)
        except FileNotFoundError:
            return False
        _fsync_dir(self.root / kind)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def list(self, kind: str) -> list[dict[str, Any]]:
        """Every object of `kind`, oldest first (then by id)."""
        items = []
        for entry in self._entries(kind):
            if (meta := self.get(kind, entry)) is not None:
                items.append(meta)
        return sorted(items, key=lambda m: (m["created_at"], m["id"]))

    def exists(self, kind: str, object_id: str) -> bool:
        folder = self._folder(kind, object_id)
        return folder is not None and (folder / META).is_file()

    def count(self, kind: str) -> int:
        return sum(1 for _ in self._entries(kind))

    def _entries(self, kind: str) -> Iterator[str]:
        prefix = CONSENT_PREFIX if kind == "consents" else VOICE_PREFIX
        try:
            names = os.listdir(self.root / kind)
        except FileNotFoundError:
            return
        yield from (name for name in names if valid_id(name, prefix))

    def _folder(self, kind: str, object_id: str) -> Path | None:
        prefix = CONSENT_PREFIX if kind == "consents" else VOICE_PREFIX
        return self.root / kind / object_id if valid_id(object_id, prefix) else None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
