"""The terminal client and the replay over WebRTC (aiortc), against the real gateway (echo responder).

The gateway's WebRTC signalling runs on its own port today, so the tests pass --signalling-url.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("aiortc")

from gateway.clients import cli as client  # noqa: E402
from gateway.clients.connection import signalling_url_for  # noqa: E402
from gateway.clients.replay import Options, main, replay  # noqa: E402
from gateway.responders.echo import EchoResponder  # noqa: E402
from tests.conftest import connect, load_pcm  # noqa: E402

SHORT_SPEECH_MS = (500, 1800)  # one_sentence.wav cut short: its speech from 500 ms, cut at 1800 ms


@pytest.fixture
def short_wav(tmp_path: Path) -> Path:
    """1.8 s of one_sentence.wav (1.3 s of speech), then 0.8 s of silence: one quick turn."""
    path = tmp_path / "short.wav"
    client.write_wav(path, load_pcm("one_sentence.wav")[: 48 * SHORT_SPEECH_MS[1]] + bytes(48 * 800))
    return path


@pytest.fixture
async def gateway(start_gateway):
    # Faster than real time, like a TTS engine: a reply is still being made when a barge-in comes.
    return await start_gateway(EchoResponder(pace=1.5), webrtc__enabled=True)


def urls(gateway) -> list[str]:
    return ["--url", f"ws://127.0.0.1:{gateway.port}/v1/realtime",
            "--signalling-url", f"http://127.0.0.1:{gateway.port}/v1/realtime/calls"]


def read_pcm(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def events_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


def client_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    client.add_arguments(parser)
    return parser.parse_args(argv)


async def test_client_sends_a_wav_and_writes_the_reply(start_gateway, short_wav: Path, tmp_path: Path, capsys) -> None:
    # Echo at once: response.done comes before the playout starts, and the client must still wait for it.
    gateway = await start_gateway(webrtc__enabled=True)
    out = tmp_path / "reply.wav"
    args = client_args("--webrtc", "--wav", str(short_wav), "--out", str(out), *urls(gateway))
    assert await client.session(args) == 0
    printed = capsys.readouterr().out
    assert "over webrtc" in printed
    for kind in ("session.created", "input_audio_buffer.speech_stopped", "output_audio_buffer.started",
                 "response.done", "output_audio_buffer.stopped"):
        assert f"< {kind}" in printed
    assert "output_audio.delta" not in printed  # the reply came on the track
    # The client waited for the playout to end: the reply is all there (the speech plus the VAD's
    # padding, in whole 20 ms frames), and it is the speech that was sent, through Opus twice.
    reply = read_pcm(out)
    spoken = np.frombuffer(load_pcm("one_sentence.wav"), dtype="<i2")[24 * SHORT_SPEECH_MS[0] : 24 * SHORT_SPEECH_MS[1]]
    assert len(spoken) <= len(reply) <= 24 * 2600
    assert similarity(reply, spoken) > 0.8


def similarity(heard: np.ndarray, said: np.ndarray) -> float:
    """The best normalised correlation of ``said`` anywhere in ``heard`` (1.0: the same waveform)."""
    heard, said = heard.astype(np.float64), said.astype(np.float64)
    n = len(heard) + len(said)
    corr = np.fft.irfft(np.fft.rfft(heard, n) * np.conj(np.fft.rfft(said, n)), n)[: len(heard) - len(said) + 1]
    energy = np.concatenate([[0.0], np.cumsum(heard**2)])
    windows = np.sqrt(np.maximum(energy[len(said) :] - energy[: -len(said)], 0))
    return float(np.max(corr / (windows * np.linalg.norm(said) + 1e-9)))


async def test_replay_barge_in_and_the_same_report_as_websocket(gateway, short_wav: Path, tmp_path: Path) -> None:
    """One WAV, two turns (its copy interrupts the first reply 300 ms in), over each transport."""
    runs = {}
    for transport, speed in (("websocket", 20.0), ("webrtc", 1.0)):
        options = Options(out=tmp_path / transport, url=f"ws://127.0.0.1:{gateway.port}/v1/realtime",
                          signalling_url=f"http://127.0.0.1:{gateway.port}/v1/realtime/calls",
                          transport=transport, speed=speed, barge_in_ms=[300])
        (session,) = await replay([short_wav], options)
        report = json.loads((session.out_dir / "latency.json").read_text())
        summary = json.loads((options.out / "summary.json").read_text())
        runs[transport] = (session.out_dir, report, summary)

    folder, report, summary = runs["webrtc"]
    assert report["errors"] == [] and report["transport"] == summary["transport"] == "webrtc"
    interrupted, answered = report["turns"]
    # The server plays the reply and truncates it itself where its playout was: past the barge-in
    # point, and about what reached the client (frames in flight when it cleared excepted).
    assert interrupted["barge_in_s"] == answered["speech_started_s"]
    assert 300 <= interrupted["truncated_at_ms"] <= interrupted["played_ms"] + 60
    assert interrupted["played_ms"] == interrupted["reply_audio_ms"]  # over WebRTC, what arrives is heard
    # Marks come from the audio itself, at real time: the end of the user's speech is followed by the
    # VAD's 500 ms of silence before any reply can start.
    assert answered["speech_end_to_first_audio_ms"] >= 450
    assert answered["speech_stopped_to_first_audio_ms"] >= 0
    events = events_of(folder)
    sent = {e["event"]["type"] for e in events if e["dir"] == "send"}
    received = [e["event"] for e in events if e["dir"] == "recv"]
    assert sent == set()  # audio goes on the track, and the server truncates: nothing to send
    (truncated,) = [e for e in received if e["type"] == "conversation.item.truncated"]
    assert truncated["audio_end_ms"] == interrupted["truncated_at_ms"]
    kinds = [e["type"] for e in received]
    assert kinds.index("input_audio_buffer.speech_started", kinds.index("output_audio_buffer.started")) < kinds.index(
        "output_audio_buffer.cleared"
    )
    assert kinds[-1] == "output_audio_buffer.stopped"  # the last reply played to its end
    assert len(read_pcm(folder / "output.wav")) / 24 == pytest.approx(report["output_audio_ms"])

    # The same conversation over WebSocket: the same turns, outcomes, responses and events, less what
    # each transport carries its own way (WebSocket: audio in events; WebRTC: the server's playout).
    ws_folder, ws_report, ws_summary = runs["websocket"]
    assert ws_report["errors"] == []
    for turns in (ws_report["turns"], report["turns"]):
        assert [(t["outcome"], t["status"], t["responses"]) for t in turns] == [
            ("interrupted", "cancelled", 1), ("answered", "completed", 1)
        ]
    ws_received = {e["event"]["type"] for e in events_of(ws_folder) if e["dir"] == "recv"}
    assert ws_received - {"response.output_audio.delta"} == set(kinds) - {
        "output_audio_buffer.started", "output_audio_buffer.stopped", "output_audio_buffer.cleared"
    }
    # The answered turn's reply is the same echo on both (Opus-coded in whole frames over WebRTC; the VAD
    # may place the turn a frame apart on Opus-coded input).
    assert answered["reply_audio_ms"] == pytest.approx(ws_report["turns"][1]["reply_audio_ms"], abs=100)
    # Opus is lossy: the same WAV gives another output.wav over each transport.
    assert [len(s["output_sha256"]) for s in summary["sessions"] + ws_summary["sessions"]] == [64, 64]
    assert summary["sessions"][0]["output_sha256"] != ws_summary["sessions"][0]["output_sha256"]


@pytest.mark.parametrize(
    ("signalling", "message"),
    [
        ("ftp://127.0.0.1/v1/realtime/calls", "not an HTTP URL for WebRTC signalling"),
        ("http://127.0.0.1:1/v1/realtime/calls", "connection refused"),
        ("{webrtc}/v1/nowhere", "refused the offer: HTTP 404"),
        ("{webrtc}/v1/realtime/calls", "refused the offer: HTTP 503: This gateway holds as many sessions as it may"),
    ],
)
async def test_signalling_problems_exit_2(start_gateway, short_wav: Path, tmp_path: Path, capsys,
                                         signalling: str, message: str) -> None:
    gateway = await start_gateway(webrtc__enabled=True, server__max_sessions=1)
    url = signalling.format(webrtc=f"http://127.0.0.1:{gateway.port}")
    args = client_args("--webrtc", "--wav", str(short_wav), "--out", str(tmp_path / "r.wav"), "--signalling-url", url)
    async with connect(gateway):  # the gateway's one session: it is full
        with pytest.raises(client.CliError, match=message):
            await client.session(args)
        assert not (tmp_path / "r.wav").exists()
        # The replay's command line says it the same way (asyncio.run needs a thread without a running loop).
        code = await asyncio.to_thread(
            main, ["--transport", "webrtc", "--signalling-url", url, "--out", str(tmp_path / "runs"), str(short_wav)]
        )
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


WITHOUT_AIORTC = """
import sys
sys.modules["aiortc"] = None  # as if the webrtc extra were not installed: importing it fails
from gateway.clients import cli as client, replay  # the WebSocket client and replay import without it
sys.exit(client.main(sys.argv[1:]) * 10 + replay.main(["--transport", "webrtc", "--out", sys.argv[-1] + ".d",
                                                        sys.argv[2]]))
"""


def test_webrtc_without_aiortc_says_how_to_install(short_wav: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.wav"
    command = [sys.executable, "-c", WITHOUT_AIORTC, "--wav", str(short_wav), "--webrtc", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 * 10 + 2, done.stderr
    assert done.stderr.count("pip install 'voice-gateway[webrtc]'") == 2 and "Traceback" not in done.stderr
    assert not out.exists()


def test_signalling_url_follows_the_websocket_url() -> None:
    assert signalling_url_for("ws://127.0.0.1:8000/v1/realtime") == "http://127.0.0.1:8000/v1/realtime/calls"
    assert (signalling_url_for("wss://api.openai.com/v1/realtime?model=gpt-realtime")
            == "https://api.openai.com/v1/realtime/calls?model=gpt-realtime")
    assert signalling_url_for("wss://proxy.example/openai/v1/realtime/") == "https://proxy.example/openai/v1/realtime/calls"
    assert signalling_url_for("ws://h:9/", beta=True) == "http://h:9/v1/realtime"


async def test_with_server_playout_a_reply_is_over_once_played() -> None:
    """response.done comes before the gateway's playout starts (its next frame): not over yet."""
    tracker = client.TurnTracker(server_playout=True)
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "response.created"):
        tracker.update({"type": kind})
    tracker.update({"type": "response.done", "response": {"id": "resp_1", "status": "completed"}})
    assert not tracker.quiet
    tracker.update({"type": "output_audio_buffer.started", "response_id": "resp_1"})
    assert not await tracker.wait_quiet(client.PLAYOUT_START_GRACE_S * 2)  # playing
    tracker.update({"type": "output_audio_buffer.stopped", "response_id": "resp_1"})
    assert tracker.quiet
    # A response with no audio to play: over once its playout could have started and did not.
    tracker.update({"type": "response.done", "response": {"id": "resp_2", "status": "cancelled"}})
    assert not tracker.quiet
    assert await tracker.wait_quiet(client.PLAYOUT_START_GRACE_S * 4)
