"""The documentation: the MkDocs site builds with --strict (every link and anchor resolves, every included file
exists), and the README's links point at files that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

pytest.importorskip("mkdocs", reason="mkdocs is not installed (the dev extra: mkdocs, mkdocs-material)")


def test_the_site_builds_strictly(tmp_path: Path):
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # The pages include the files they describe, whole: the default configuration; the benchmarks page links each
    # figure to its record, which the site serves beside it.
    configuration = (tmp_path / "configuration" / "index.html").read_text()
    assert "max_out_of_band_responses" in configuration and "ready_requires_backends" in configuration
    benchmarks = (tmp_path / "benchmarks" / "index.html").read_text()
    linked = re.findall(r'href="\.\./runs/([^"]+\.json)"', benchmarks)
    assert linked and all((tmp_path / "runs" / name).is_file() for name in linked)


def test_the_readme_is_one_screen_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 45
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
