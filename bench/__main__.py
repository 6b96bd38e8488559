"""``python -m bench SUITE [options]``: run a suite, write its record; ``python -m bench page``: the page."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from bench import record
from bench.suites import NAMES
from bench.targets import evaluate
from bench.validity import FAKE_OVER, LAG_P99_MS, Bounds


def suite(name: str) -> Any:
    return importlib.import_module(f"bench.suites.{name}")


def device(value: str) -> str:
    if value == "auto":
        return "cuda" if shutil.which("nvidia-smi") else "cpu"
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m bench", description="The benchmarks: one suite a command, each "
                                  "run written as a record under bench/runs/ (docs/benchmarks.md says how to run "
                                  "each).")
    sub = top.add_subparsers(dest="suite", required=True, metavar="SUITE")
    for name in NAMES:
        module = suite(name)
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                       help="where the models run (auto: cuda when there is a GPU)")
        p.add_argument("--small", action="store_true", help="a rehearsal on this CPU: the tiny checkpoints and small "
                       "levels (its record goes to bench/runs/small/, not a result)")
        p.add_argument("--records", type=Path, default=Path(os.environ.get("BENCH_RECORDS") or record.RUNS),
                       help="where the record is written (default bench/runs, or BENCH_RECORDS)")
        p.add_argument("--host-kind", default=os.environ.get("BENCH_HOST_KIND", ""),
                       help="the host's kind, for the record (e.g. nvidia-h100-x1; or BENCH_HOST_KIND)")
        p.add_argument("--max-load-lag-ms", type=float, default=LAG_P99_MS, help="a level is invalid when the load "
                       "generator's or the fakes' loop lag P99 is over this (bench/validity.py)")
        p.add_argument("--max-fake-over", type=float, default=FAKE_OVER, help="a level is invalid when the fakes' "
                       "latency P95 is over their fixed one by more than this fraction")
        module.add_arguments(p)
    page = sub.add_parser("page", help="write docs/benchmarks.md from the records")
    page.add_argument("--check", action="store_true", help="say whether the committed page is up to date")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.suite == "page":
        from bench import page

        return page.main(args.check)
    args.device = "cpu" if args.small else device(args.device)
    if args.small:  # the rehearsal's processes share a few cores: one torch thread each, as the tests run
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.bounds = Bounds(args.max_load_lag_ms, args.max_fake_over)
    started = record.utc_now()
    body = suite(args.suite).run(args)
    commit, dirty = record.commit()
    result = {
        "suite": args.suite, "setup": body["setup"], "date": started, "commit": commit, "dirty": dirty,
        "command": record.command_line(argv), "device": args.device, "small": args.small,
        "machine": record.machine(args.host_kind), "validity_bounds": args.bounds.as_dict(),
        "settings": body["settings"], "levels": body["levels"],
        "targets": evaluate(args.suite, body["levels"]),
        "valid": all(level.get("valid") is not False for level in body["levels"]),
    }
    path = record.write(result, args.records)
    for target in result["targets"]:
        print(f"{target['what']}: {target['figure']} (bound {target['bound']}): {target['status']}")
    verdicts = [level.get("valid") for level in body["levels"]]
    print(f"{len(verdicts)} levels: {verdicts.count(True)} valid, {verdicts.count(False)} INVALID (their load side "
          f"did not keep up), {verdicts.count(None)} with no load side to judge")
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
