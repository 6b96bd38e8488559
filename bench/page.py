"""docs/benchmarks.md, made from the records: every target's current figure (the latest record whose levels
for it are valid, per setup and machine) with a link to its record, and how to run each suite.
``python -m bench page`` writes it; ``--check`` says whether the committed page is what the records make."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path
from typing import Any

from bench import record
from bench.suites import NAMES
from bench.targets import TARGETS
from bench.validity import FAKE_OVER, LAG_P99_MS

PAGE = record.ROOT / "docs" / "benchmarks.md"
LATEST = 4  # records listed per suite

HEAD = f"""# Benchmarks

<!-- Made by `python -m bench page` from the records in bench/runs/: edit those or bench/page.py, not this. -->

Every figure the project reports is a benchmark record: one JSON file under `bench/runs/` per run, with the
machine and its cards, the cores it used, the commit, the date, the exact command, every level's figures beside
its load side's own, and each target with its bound and whether it was met (`bench/record.py`).
`python -m bench SUITE` runs a suite and writes its record (`--small`: a rehearsal on this CPU with the tiny
checkpoints, kept apart in `bench/runs/small/`); `python -m bench page` makes this page from the records.

A benchmark is never the bottleneck. The load generator and the fake backends report their own lag and
latencies, and a level is **INVALID**, not a result, when a load-generator process's event loop lag P99 is over
{LAG_P99_MS:g} ms, a session started late or a phone call was not answered, the fake STT's or LLM's latency P95
is over its fixed value (100 ms, first token 80 ms) by more than {FAKE_OVER:.0%}, or a fake's loop lag P99 is over
{LAG_P99_MS:g} ms (`bench/validity.py`). A target takes the worst of its valid levels; the capacity targets need
two valid Poisson runs. † marks a record imported from before the tool existed: its figures are as measured then,
its load side was not checked.
"""


def _number(value: Any, unit: str) -> str:
    if value is None:
        return "-"
    text = str(int(value)) if isinstance(value, float) and value.is_integer() and not unit else str(value)
    return f"{text} {unit}".strip()


def _date(stamp: str) -> str:
    return stamp[:16].replace("T", " ") + " UTC"


def current(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], tuple[dict[str, Any], dict[str, Any]]]:
    """(target id, setup, machine) -> (the latest record with a valid figure for it, that figure)."""
    out: dict[tuple[str, str, str], tuple[dict[str, Any], dict[str, Any]]] = {}
    for rec in sorted(records, key=lambda r: r["date"]):
        for target in rec.get("targets", []):
            if target["status"] != "invalid":
                out[(target["id"], rec["setup"], record.card(rec))] = (rec, target)
    return out


def targets_table(suite: str, found: dict[tuple[str, str, str], tuple[dict[str, Any], dict[str, Any]]]) -> str:
    rows = []
    for target in (t for t in TARGETS if t.suite == suite):
        for (tid, setup, card), (rec, figure) in sorted(found.items()):
            if tid != target.id:
                continue
            mark = "" if figure.get("load_checked", True) else " †"
            link = f"[{rec['file']}](runs/{rec['file']}){mark}"
            rows.append(f"| {target.what} | {setup} | {_number(figure['figure'], target.unit)} | {target.bound_text} | "
                        f"{figure['status']} | {card} | {_date(rec['date'])} | {link} |")
    if not rows:
        return ""
    return ("| target | setup | figure | bound | status | machine | date | record |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n")


def suite_section(name: str, records: list[dict[str, Any]], table: str) -> str:
    module = importlib.import_module(f"bench.suites.{name}")
    mine = sorted((r for r in records if r["suite"] == name), key=lambda r: r["date"], reverse=True)[:LATEST]
    lines = [f"## {name}", "", module.HELP[0].upper() + module.HELP[1:] + ".", "", "```sh", textwrap.dedent(module.HOW),
             "```", ""]
    if table:
        lines += [table]
    if mine:
        lines.append("Latest records:")
        lines.append("")
        for rec in mine:
            mark = " †" if rec.get("imported") else ""
            lines.append(f"- {_date(rec['date'])}, {rec['setup']}, {record.card(rec)}: "
                         f"[{rec['file']}](runs/{rec['file']}){mark}")
        lines.append("")
    return "\n".join(lines)


def render(records: list[dict[str, Any]]) -> str:
    found = current(records)
    return HEAD + "\n" + "\n".join(suite_section(name, records, targets_table(name, found)) for name in NAMES)


def main(check: bool = False, folder: Path = record.RUNS) -> int:
    text = render(record.load(folder))
    if check:
        same = PAGE.exists() and PAGE.read_text() == text
        print("docs/benchmarks.md is up to date" if same else "docs/benchmarks.md is stale: python -m bench page")
        return 0 if same else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(record.ROOT)} from {len(record.load(folder))} records")
    return 0
