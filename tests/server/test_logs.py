"""Logs a person can read: the libraries' chatter only at DEBUG, and Ctrl-C that ends the process at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from bench.launcher import free_port
from tests.conftest import no_error_lines_in
from tests.paths import ROOT

CHATTER = """
import logging, sys, warnings
from gateway.logs import configure_logging
configure_logging(sys.argv[1])
logging.getLogger("aioice.ice").info("Connection(0) Check CandidatePair ... State.WAITING -> State.IN_PROGRESS")
logging.getLogger("httpx2").info("HTTP Request: POST http://llm/v1/chat/completions")
warnings.warn("`past_key_values` is deprecated", FutureWarning)
from tqdm import tqdm
for _ in tqdm(range(3), desc="Loading weights"):
    pass
logging.getLogger("gateway.runtime.gateway").info("session sess_1 opened")
"""


@pytest.mark.parametrize("level", ["INFO", "debug"])
def test_the_libraries_chatter_shows_only_at_debug(level: str):
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    run = subprocess.run([sys.executable, "-c", CHATTER, level], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert "session sess_1 opened" in lines[-1]
    chatter = ("Check CandidatePair", "HTTP Request", "past_key_values", "Loading weights")
    if level == "INFO":
        assert len(lines) == 1, lines
    else:
        assert all(any(c in line for line in lines) for c in chatter), lines


FAILURES = """
import logging
from gateway.logs import configure_logging
configure_logging("INFO")

def handle(body):  # two different bugs that clients' requests reach
    return {}["missing"] if body == "a" else len(body)

for body in ["a", 5, "a", 5]:
    try:
        handle(body)
    except Exception:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application\\n")  # as uvicorn logs a 500
"""


def test_two_different_failures_in_a_row_each_get_their_own_traceback():
    """The repeat filter holds back the same traceback within its interval, never a different one."""
    run = subprocess.run([sys.executable, "-c", FAILURES], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("Exception in ASGI application") == 2, run.stderr
    assert run.stderr.count("Traceback") == 2, run.stderr
    assert "KeyError: 'missing'" in run.stderr and "TypeError: object of type 'int' has no len()" in run.stderr


def test_ctrl_c_ends_an_idle_gateway_within_a_second(tmp_path):
    """After a session came and went; the models' native teardown does not hold the exit up."""
    port = free_port()
    env = {**os.environ, "GATEWAY_SERVER_PORT": str(port), "GATEWAY_WEBRTC_ENABLED": "false",
           "GATEWAY_RESPONDER_KIND": "echo", "GATEWAY_RESPONDER_ECHO_PACE": "0", "GATEWAY_LOCAL_STT": "false"}
    with open(tmp_path / "gateway.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "gateway", "serve"], cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline and process.poll() is None, (tmp_path / "gateway.log").read_text()
            time.sleep(0.05)
        client = subprocess.run([sys.executable, "-m", "gateway", "client", "--url", f"ws://127.0.0.1:{port}/v1/realtime",
                                 "--wav", str(ROOT / "tests" / "fixtures" / "one_sentence.wav"),
                                 "--out", str(tmp_path / "reply.wav")], cwd=ROOT, capture_output=True, timeout=120)
        assert client.returncode == 0, client.stdout[-2000:]
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(10) == 0
        assert time.monotonic() - started < 1.0
    finally:
        if process.poll() is None:
            process.kill()
    log = (tmp_path / "gateway.log").read_text()
    assert "drained: 0 session(s) left" in log
    no_error_lines_in(log)
