"""MkDocs hook (mkdocs.yml `hooks`): the benchmark records (bench/runs/*.json) join the site as runs/NAME.json,
so that docs/benchmarks.md links each figure to its record and `mkdocs build --strict` checks the links."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RUNS = Path(__file__).resolve().parent / "runs"


def on_files(files: Files, config: Any) -> Files:
    for path in sorted(RUNS.glob("*.json")):
        files.append(File.generated(config, f"runs/{path.name}", abs_src_path=str(path)))
    return files
