"""The replay tool and the terminal client against the real gateway (echo responder, in-process)."""

from __future__ import annotations

import argparse
import json
import socket
import wave
from pathlib import Path

import pytest

from gateway import client
from gateway.replay import Options, main, replay

FIXTURES = Path(__file__).parent / "fixtures"
TWO_TURNS = FIXTURES / "two_turns.wav"
ONE_SENTENCE = FIXTURES / "one_sentence.wav"
SPEED = 20.0  # the echo replies at once (pace 0), so only the simulated clock sets the pace


def url_of(gateway) -> str:
    return f"ws://127.0.0.1:{gateway.port}/v1/realtime"


def wav_ms(path: Path) -> float:
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return w.getnframes() / 24.0


def fixture_speech_ms(name: str) -> list[list[int]]:
    return json.loads((FIXTURES / "fixtures.json").read_text())[name]["speech_ms"]


async def test_two_concurrent_sessions_and_same_hashes_twice(start_gateway, tmp_path: Path) -> None:
    gateway = await start_gateway()
    runs = []
    for name in ("first", "second"):
        options = Options(out=tmp_path / name, url=url_of(gateway), speed=SPEED, turn_gap_ms=200)
        runs.append(await replay([TWO_TURNS, ONE_SENTENCE], options))

    for sessions in runs:
        assert [s.out_dir.name for s in sessions] == ["two_turns", "one_sentence"]
        for session, wav in zip(sessions, (TWO_TURNS, ONE_SENTENCE), strict=True):
            folder = session.out_dir
            assert {p.name for p in folder.iterdir()} >= {"output.wav", "events.jsonl", "latency.json"}
            report = json.loads((folder / "latency.json").read_text())
            assert report["errors"] == []
            turns = report["turns"]
            assert len(turns) == len(fixture_speech_ms(wav.name))
            for turn, (start, end) in zip(turns, fixture_speech_ms(wav.name), strict=True):
                assert turn["outcome"] == "answered" and turn["status"] == "completed"
                assert turn["speech_stopped_s"] >= turn["speech_started_s"]
                assert 0 <= turn["speech_stopped_to_first_audio_ms"] <= turn["speech_stopped_to_response_done_ms"]
                assert turn["barge_in_to_response_done_ms"] is None
                # The echo returns the turn: its speech plus VAD padding, never more than the file.
                assert end - start <= turn["reply_audio_ms"] <= wav_ms(wav)
            total = sum(t["reply_audio_ms"] for t in turns)
            assert report["output_audio_ms"] == pytest.approx(total)
            assert wav_ms(folder / "output.wav") == pytest.approx(total)

            events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
            assert all(e["dir"] in ("send", "recv") and e["t"] >= 0 for e in events)
            kinds = [e["event"]["type"] for e in events]
            assert kinds[0] == "session.created"
            assert kinds.count("response.done") == len(turns)
            # base64 audio is reduced to its size
            appends = [e["event"] for e in events if e["event"]["type"] == "input_audio_buffer.append"]
            assert appends and all("audio" not in a and a["audio_bytes"] == 960 for a in appends[:-1])
            deltas = [e["event"] for e in events if e["event"]["type"] == "response.output_audio.delta"]
            assert deltas and all("delta" not in d and d["delta_bytes"] > 0 for d in deltas)

        summary = json.loads((sessions[0].out_dir.parent / "summary.json").read_text())
        assert [s["output_sha256"] for s in summary["sessions"]] == [s.sha256 for s in sessions]

    first, second = ([s.sha256 for s in sessions] for sessions in runs)
    assert first == second
    assert first[0] != first[1]


async def test_barge_in_truncates_what_was_heard(start_gateway, tmp_path: Path) -> None:
    gateway = await start_gateway()
    options = Options(out=tmp_path, url=url_of(gateway), speed=SPEED, barge_in_ms=[500])
    (session,) = await replay([TWO_TURNS], options)

    report = json.loads((session.out_dir / "latency.json").read_text())
    assert report["errors"] == []
    interrupted, last = report["turns"]
    assert interrupted["outcome"] == "interrupted" and last["outcome"] == "answered"
    # Heard at least up to the barge-in point, then cut before the end of the reply.
    assert 500 <= interrupted["truncated_at_ms"] < interrupted["reply_audio_ms"]
    assert interrupted["barge_in_s"] == last["speech_started_s"]

    events = [json.loads(line)["event"] for line in (session.out_dir / "events.jsonl").read_text().splitlines()]
    (truncate,) = [e for e in events if e["type"] == "conversation.item.truncate"]
    (truncated,) = [e for e in events if e["type"] == "conversation.item.truncated"]
    assert truncate["content_index"] == 0 and truncate["audio_end_ms"] == interrupted["truncated_at_ms"]
    assert truncated["item_id"] == truncate["item_id"]
    assert truncated["audio_end_ms"] == truncate["audio_end_ms"]


async def test_client_streams_a_wav_and_saves_the_reply(start_gateway, tmp_path: Path, capsys) -> None:
    gateway = await start_gateway()
    out = tmp_path / "reply.wav"
    args = argparse.Namespace(url=url_of(gateway), wav=str(ONE_SENTENCE), out=str(out), beta=True)
    assert await client.session(args) == 0
    printed = capsys.readouterr().out
    assert "response.audio.delta" in printed and "B" in printed  # beta names, sizes instead of base64
    assert all(len(line) < 300 for line in printed.splitlines())
    ((start, end),) = fixture_speech_ms(ONE_SENTENCE.name)
    assert end - start <= wav_ms(out) <= wav_ms(ONE_SENTENCE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("wav", "url", "message"),
    [
        ("/no/such.wav", None, "/no/such.wav: no such file"),
        (str(FIXTURES / "fixtures.json"), None, "not a PCM WAV file"),
        (str(ONE_SENTENCE), "http://127.0.0.1:1/", "not a WebSocket URL"),
        (str(ONE_SENTENCE), f"ws://127.0.0.1:{free_port()}/v1/realtime", "connection refused"),
    ],
)
def test_command_line_errors_exit_2_without_traceback(wav, url, message, tmp_path: Path, capsys) -> None:
    url_args = ["--url", url] if url else []
    assert main(["--out", str(tmp_path), *url_args, wav]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err

    parser = argparse.ArgumentParser()
    client.add_arguments(parser)
    assert client.run(parser.parse_args(["--wav", wav, "--out", str(tmp_path / "r.wav"), *url_args])) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_unwritable_output_exits_2_before_connecting(tmp_path: Path, capsys) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    unused_port = f"ws://127.0.0.1:{free_port()}/v1/realtime"  # never reached: the output is checked first
    assert main(["--out", str(not_a_folder / "results"), "--url", unused_port, str(ONE_SENTENCE)]) == 2
    assert "cannot create" in capsys.readouterr().err

    parser = argparse.ArgumentParser()
    client.add_arguments(parser)
    args = parser.parse_args(["--wav", str(ONE_SENTENCE), "--out", str(not_a_folder / "r.wav"), "--url", unused_port])
    assert client.run(args) == 2
    assert "cannot write" in capsys.readouterr().err
