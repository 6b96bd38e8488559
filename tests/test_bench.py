"""The benchmark tool: a --small gateway level on the CPU writes a whole record, a level whose load side did not
keep up is INVALID and no result, targets take valid levels only, docs/benchmarks.md is what the records
make, and the phone suite times a call on its phone's recordings and both paths side by side."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import page, record
from bench.phones import BARESIP
from bench.suites import NAMES, phone
from bench.targets import TARGETS, evaluate
from bench.validity import Bounds, judge
from tests.paths import ROOT


@pytest.fixture(scope="module")
def overloaded_level(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The record of one level of 2 sessions through the gateway (one process, the engine in its thread on the tiny
    checkpoint: the quickest to start), the fakes and the load generator, judged with no margin at all over the fakes'
    fixed latencies: any real answer is over it, as an overloaded fake's is. One run serves the tests of the record
    and of its verdict (a run takes half a minute)."""
    records = tmp_path_factory.mktemp("records")
    done = subprocess.run([sys.executable, "-m", "bench", "gateway", "--small", "--sessions", "2", "--arrivals",
                           "poisson", "--spread", "1", "--workers", "1", "--engine-mode", "thread", "--records",
                           str(records), "--max-fake-over", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (path,) = (records / "small").glob("*.json")
    assert f"record: {path}" in done.stdout
    return json.loads(path.read_text())


def test_the_cli_lists_every_suite():
    done = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True)
    for suite in (*NAMES, "page"):
        assert f"    {suite}" in done.stdout


def test_a_small_gateway_level_writes_its_record(overloaded_level: dict[str, Any]):
    rec = overloaded_level
    assert (rec["suite"], rec["small"], rec["device"]) == ("gateway", True, "cpu")
    assert rec["command"].startswith("python -m bench gateway --small --sessions 2")
    assert rec["commit"] and rec["date"].endswith("Z") and rec["setup"] == "tiny, 0 GPUs, 1 worker"
    assert rec["machine"]["cores"] >= rec["machine"]["cores_used"] >= 1 and rec["machine"]["gpus"] == []
    assert rec["settings"]["gateway"]["engine.checkpoint"].endswith("tests/data/qwen3_tts_tiny")
    (level,) = rec["levels"]
    assert (level["sessions"], level["arrivals"], level["model"], level["workers"]) == (2, "poisson", "tiny", 1)
    for figure in ("first_delta_p95_ms", "vad_late_p95_ms", "worker_lag_p99_ms", "barge_in_p95_ms",
                   "cpu_s_per_session_min"):
        assert figure in level
    assert isinstance(level["audio_errors"], int) and len(level["worker_lag_p99_each_ms"]) == 1
    load = level["load"]
    assert load["client_processes"] == 1 and load["client_lag_p99_ms"] >= 0 and load["late_starts"] >= 0
    # the fakes' own view of their answers: never sooner than their fixed latencies, one answer of each per turn
    fake = load["fake"]
    assert fake["stt_p50_ms"] >= fake["stt_ms"] == 100 and fake["llm_p50_ms"] >= fake["llm_ms"] == 80
    assert fake["requests"] >= 2 and fake["lag_p99_ms"] >= 0
    # the verdict follows from the load figures and the bounds the record keeps
    bounds = Bounds(**rec["validity_bounds"])
    assert level["invalid"] == judge(load, bounds) and level["valid"] is (not level["invalid"])
    assert rec["valid"] is level["valid"] and rec["targets"] == []  # the tiny model bears on no target


def test_an_overloaded_load_side_is_invalid_not_a_result(overloaded_level: dict[str, Any]):
    rec = overloaded_level
    (level,) = rec["levels"]
    assert level["valid"] is False and rec["valid"] is False
    assert any(reason.startswith("fake STT P95") and "100 ms fixed" in reason for reason in level["invalid"])
    assert rec["validity_bounds"]["fake_over"] == 0


def test_a_small_sip_level_calls_the_gateway_and_times_its_calls(tmp_path: Path):
    """Two phone calls (SIP and RTP from the load generator's process) to a gateway on loopback, the tone TTS
    answering; judged with no room at all for the load generator's lag, as an overloaded one's is."""
    done = subprocess.run([sys.executable, "-m", "bench", "gateway", "--small", "--tts", "tone", "--workers", "1",
                           "--sessions", "2", "--arrivals", "poisson", "--spread", "1", "--protocol", "sip",
                           "--records", str(tmp_path), "--max-load-lag-ms", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (path,) = (tmp_path / "small").glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["setup"] == "tone TTS, 0 GPUs, 1 worker, SIP calls"
    assert rec["settings"]["gateway"]["sip.enabled"] is True
    (level,) = rec["levels"]
    assert (level["protocol"], level["calls_answered"], level["unanswered"], level["audio_errors"]) == ("sip", 2, [], 0)
    # each call's two turns: turn 1's reply cut by turn 2 (the barge-in), turn 2's heard to its end
    assert level["responses"] == {"cancelled": 2, "completed": 2}
    # the gateway's speech_stopped against the phone's clock, the VAD's 500 ms of silence in the phone's stopwatch
    assert 0 <= level["vad_late_p50_ms"] <= level["vad_late_p95_ms"] < 200
    assert 100 < level["first_delta_p50_ms"] < level["end_to_audio_p50_ms"] - 400
    assert level["barge_in_p50_ms"] > 0 and level["worker_lag_p99_ms"] >= 0
    assert level["load"]["unanswered_calls"] == 0 and level["load"]["client_lag_p99_ms"] > 0
    assert level["valid"] is False and level["invalid"][0].startswith("load generator lag P99")


def test_targets_take_valid_levels_only_and_capacity_needs_two_runs():
    def run(first_delta: float, valid: bool | None) -> dict[str, Any]:
        return {"responder": "pipeline", "tts": "engine", "model": "0.6b", "sessions_per_gpu": 1000,
                "arrivals": "poisson", "first_delta_p95_ms": first_delta, "valid": valid}

    def verdict(levels: list[dict[str, Any]]) -> dict[str, Any]:
        return next(t for t in evaluate("gateway", levels) if t["id"] == "gateway.0.6b.1000.first_delta")

    assert verdict([run(180, True), run(190, True)]) == verdict([run(190, True), run(180, True)])
    both = verdict([run(180, True), run(190, True)])
    assert (both["figure"], both["status"], both["met"]) == (190, "met", True)
    one = verdict([run(180, True), run(900, False)])  # the overloaded run is no result, good or bad
    assert (one["figure"], one["status"], one["met"], one["invalid_runs"]) == (180, "1 of 2 runs", False, 1)
    assert verdict([run(900, False), run(900, False)])["status"] == "invalid"
    assert verdict([run(180, True), run(260, True)])["status"] == "not met"
    assert verdict([run(180, None), run(190, None)])["load_checked"] is False  # imported: not judged


def test_the_benchmarks_page_is_what_the_records_make():
    records = record.load()
    assert records, "bench/runs/ holds the records the page is made from"
    text = page.PAGE.read_text()
    assert text == page.render(records), "docs/benchmarks.md is stale: python -m bench page"
    for rec in records:
        assert {"suite", "setup", "date", "commit", "command", "machine", "levels", "targets"} <= rec.keys()
    linked = set(re.findall(r"\(runs/([^)]+\.json)\)", text))
    assert linked and linked <= {rec["file"] for rec in records}
    # every current target a record bears on shows its current figure (a retired one stays in its records only)
    current = {target.id for target in TARGETS}
    shown = {t["what"] for rec in records for t in rec["targets"] if t["status"] != "invalid" and t["id"] in current}
    assert all(f"| {what} |" in text for what in shown)


def _dump(path: Path, seconds: float, sound: tuple[float, float]) -> None:
    """A phone's recording at 8 kHz: silence with a tone over `sound` (start, end) seconds."""
    t = np.arange(int(seconds * 8000)) / 8000
    samples = np.where((t >= sound[0]) & (t < sound[1]), 8000 * np.sin(2 * np.pi * 440 * t), 0)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(samples.astype("<i2").tobytes())


def test_a_calls_latency_is_timed_on_recordings_aligned_by_their_ends(tmp_path: Path):
    # what the phone sent: the question's sound ends at 1.6 s; what it heard started 40 ms later (its recording is
    # 40 ms shorter at the hang-up), and the answer is at 2.3 s of it: 2.34 s on the sent clock, 740 ms later
    _dump(tmp_path / "dump-call-enc.wav", 7.04, (0.5, 1.6))
    _dump(tmp_path / "dump-call-dec.wav", 7.0, (2.3, 4.0))
    latency, offset = phone.call_latency(tmp_path)
    assert latency is not None and round(latency * 1000) == 740 and round(offset * 1000) == 40
    _dump(tmp_path / "dump-call-dec.wav", 7.0, (1.0, 1.2))  # heard nothing after the question
    assert phone.call_latency(tmp_path)[0] is None


@pytest.mark.skipif(BARESIP is None, reason="baresip is not installed (apt-get install baresip)")
def test_a_small_phone_run_times_both_paths_and_their_cpu(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "bench", "phone", "--small", "--trials", "1", "--calls", "1",
                           "--seconds", "2", "--records", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (path,) = (tmp_path / "small").glob("*.json")
    rec = json.loads(path.read_text())
    latency = {lv["path"]: lv for lv in rec["levels"] if lv["measure"] == "latency"}
    cpu = {lv["path"]: lv for lv in rec["levels"] if lv["measure"] == "cpu"}
    assert latency.keys() == cpu.keys() == {"sip", "websocket"}
    for level in latency.values():  # the fakes' fixed 180 ms and the VAD's silence are in every answer
        assert level["answered"] == 1 and level["end_of_speech_to_first_audio_p50_ms"] > 500
        assert level["load"]["fake"]["stt_ms"] == 100 and level["load"]["client_lag_p99_ms"] >= 0
    sip = latency["sip"]
    assert sip["added_p95_ms"] == pytest.approx(sip["end_of_speech_to_first_audio_p95_ms"]
                                                - latency["websocket"]["end_of_speech_to_first_audio_p95_ms"], abs=0.2)
    assert abs(sip["dump_offsets_ms"][0]) <= phone.MAX_OFFSET_MS
    assert all(level["cpu_s"] > 0 and level["cpu_s_per_call_min"] == pytest.approx(level["cpu_s"] * 30, rel=0.01)
               for level in cpu.values())
    assert [t["id"] for t in rec["targets"]] == ["phone.sip.added"]
