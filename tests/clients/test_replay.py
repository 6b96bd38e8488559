"""The replay tool and the terminal client against the real gateway (echo responder, in-process)."""

from __future__ import annotations

import argparse
import json
import re
import struct
import wave
from pathlib import Path

import numpy as np
import pytest

from bench.fake_openai import FakeOpenAI
from bench.launcher import free_port
from gateway.clients import cli as client
from gateway.clients.replay import Options, main, replay
from tests.paths import FIXTURES

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
                # From the end of the speech the wait includes the VAD's silence (500 ms of audio, sent
                # SPEED times faster than real time), so it is longer than from speech_stopped's arrival.
                assert (turn["speech_end_to_first_audio_ms"]
                        >= turn["speech_stopped_to_first_audio_ms"] + 500 / SPEED * 0.5)
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
    parser = argparse.ArgumentParser()
    client.add_arguments(parser)
    args = parser.parse_args(["--url", url_of(gateway), "--wav", str(ONE_SENTENCE), "--out", str(out), "--beta"])
    assert await client.session(args) == 0
    printed = capsys.readouterr().out
    assert "response.audio.delta" in printed and "B" in printed  # beta names, sizes instead of base64
    assert all(len(line) < 300 for line in printed.splitlines())
    ((start, end),) = fixture_speech_ms(ONE_SENTENCE.name)
    assert end - start <= wav_ms(out) <= wav_ms(ONE_SENTENCE)


async def test_client_prints_whole_transcripts_a_latency_line_per_turn_and_fails_on_an_error(
        start_pipeline, tmp_path: Path, capsys) -> None:
    heard = "Could you tell me, in a few words, how many legs a spider has and whether it is an insect?"
    parser = argparse.ArgumentParser()
    client.add_arguments(parser)
    async with FakeOpenAI(transcript=heard, reply="A spider has eight legs; it is not an insect.") as fake:
        gateway = await start_pipeline(fake)
        args = parser.parse_args(["--url", url_of(gateway), "--wav", str(ONE_SENTENCE), "--out", str(tmp_path / "r")])
        assert await client.session(args) == 0
        printed = capsys.readouterr().out
        assert repr(heard) in printed and repr("A spider has eight legs; it is not an insect.") in printed
        turn = re.search(r"\* turn 1 \(completed\), first audio (\d+) ms after your speech ended, (\d+) ms after "
                         r"speech_stopped, done (\d+) ms after speech_stopped", printed)
        assert turn is not None, printed
        # The end of speech came a VAD silence (500 ms) before speech_stopped.
        assert int(turn[1]) >= int(turn[2]) + 400

    async with FakeOpenAI(llm_failure="500") as failing:
        gateway = await start_pipeline(failing)
        args = parser.parse_args(["--url", url_of(gateway), "--wav", str(ONE_SENTENCE), "--out", str(tmp_path / "r")])
        assert await client.session(args) == 1
        printed = capsys.readouterr().out
        assert "turn 1 (failed), no audio" in printed
        assert "error event: llm_backend_error" in printed and re.search(r"response resp_\w+ failed: ", printed)


@pytest.mark.parametrize(
    ("wav", "url", "message"),
    [
        ("/no/such.wav", None, "/no/such.wav: no such file"),
        (str(FIXTURES / "fixtures.json"), None, "not a WAV file"),
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
    assert not (tmp_path / "r.wav").exists()  # a failed run leaves no broken reply file behind


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


def riff(tag: int, channels: int, rate: int, bits: int, payload: bytes, extensible: bool = False) -> bytes:
    """A WAV file written by hand: plain or WAVE_FORMAT_EXTENSIBLE (as sox and ffmpeg write them)."""
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 0xFFFE if extensible else tag, channels, rate, rate * block, block, bits)
    if extensible:
        guid_tail = bytes.fromhex("000000001000800000aa00389b71")
        fmt += struct.pack("<HHIH", 22, bits, 0, tag) + guid_tail
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


TONE = np.sin(2 * np.pi * 440 * np.arange(4800) / 48000)  # 100 ms at 48 kHz


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("float32, 48 kHz", riff(3, 1, 48000, 32, (0.5 * TONE).astype("<f4").tobytes())),
        ("float64, 48 kHz", riff(3, 1, 48000, 64, (0.5 * TONE).astype("<f8").tobytes())),
        ("8-bit", riff(1, 1, 48000, 8, (128 + 64 * TONE).round().astype(np.uint8).tobytes())),
        ("24-bit", riff(1, 1, 48000, 24, b"".join(int(v).to_bytes(3, "little", signed=True)
                                                   for v in (0.5 * TONE * 2**23).round()))),
        ("extensible 16-bit, 3 channels", riff(1, 3, 48000, 16, np.repeat((0.5 * TONE * 32767).astype("<i2"), 3)
                                               .tobytes(), extensible=True)),
        ("extensible float", riff(3, 1, 48000, 32, (0.5 * TONE).astype("<f4").tobytes(), extensible=True)),
    ],
)
def test_common_wav_encodings_are_read(name: str, data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "in.wav"
    path.write_bytes(data)
    samples = client.read_wav(path)
    assert len(samples) == pytest.approx(2400, abs=2)  # 100 ms at 24 kHz
    rms = np.sqrt(np.mean((samples[200:-200].astype(np.float64) / 32768) ** 2))
    assert rms == pytest.approx(0.5 / np.sqrt(2), rel=0.05)  # a half-scale sine, whatever the encoding


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (riff(7, 1, 8000, 8, bytes(80)), "unsupported WAV encoding (mu-law)"),
        (riff(1, 1, 8000, 12, bytes(80)), "unsupported WAV encoding (12-bit PCM)"),
        (b"RIFF\x04\x00\x00\x00WAVE", "without a valid fmt chunk"),
        (b"ID3 not audio at all", "not a WAV file"),
    ],
)
def test_unreadable_wavs_are_named(data: bytes, message: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.wav"
    path.write_bytes(data)
    with pytest.raises(client.CliError, match=re.escape(message)):
        client.read_wav(path)


@pytest.mark.parametrize(
    "args",
    [["--tail-ms", "-1"], ["--speed", "nan"], ["--speed", "inf"], ["--turn-gap-ms", "-5"],
     ["--barge-in-ms", "300,-1"], ["--split-silence-ms", "0"]],
)
def test_bad_replay_arguments_exit_2(args: list[str], tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--out", str(tmp_path), *args, str(ONE_SENTENCE)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


async def test_a_session_without_speech_fails_the_run(start_gateway, tmp_path: Path) -> None:
    """The regression harness must not pass when the gateway heard nothing."""
    gateway = await start_gateway()
    quiet = tmp_path / "quiet.wav"
    client.write_wav(quiet, bytes(48000))
    options = Options(out=tmp_path / "out", url=url_of(gateway), speed=SPEED)
    (session,) = await replay([quiet], options)
    assert session.errors == ["turn 1: no speech detected"]
    report = json.loads((session.out_dir / "latency.json").read_text())
    assert report["errors"] == session.errors
