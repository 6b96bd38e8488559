"""Models by name (gateway/responders/fetch.py): a folder as it is, a bad name in one line, a download's progress
as log lines (the libraries' own bars are off at INFO). The Hub cache lookup itself: tests/responders/test_local.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.config import ConfigError
from gateway.responders import fetch


def test_a_folder_is_taken_as_it_is(tmp_path: Path):
    assert fetch.fetch(str(tmp_path), ["*.json"], "local.llm_model") == tmp_path


def test_a_name_that_is_no_repository_id_is_one_line():
    with pytest.raises(ConfigError, match=r"option local.stt_model: 'a/b/c' is neither a folder nor a Hugging Face "
                                          r"repository id"):
        fetch.fetch("a/b/c", ["*.json"], "local.stt_model")


def test_a_downloads_progress_goes_to_the_log(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                              capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("TQDM_DISABLE", "1")  # as gateway.logs sets it at INFO: this bar shows all the same
    monkeypatch.setattr(fetch, "PROGRESS_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="gateway.responders.fetch")
    bar = fetch.LoggedProgress(total=400_000_000, unit="B", desc="Downloading bytes", name="hub-internal")
    for _ in range(2):
        bar.update(100_000_000)
    bar.close()
    assert [r.getMessage() for r in caplog.records] == ["  Downloading bytes: 100 of 400 MB (25%)",
                                                        "  Downloading bytes: 200 of 400 MB (50%)"]
    assert capsys.readouterr() == ("", "")  # nothing drawn on the terminal
