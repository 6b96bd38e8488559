"""How many of the demo's 20 spoken questions a gateway answers sensibly (tests/fixtures/demo/, or --set voices).

Each question is asked in a session of its own, over WebSocket as a client would: its WAV, then silence
until the gateway's turn detection ends the turn. A question counts as

- **heard** when the transcript of the turn has every word listed for it in questions.json ("heard");
- **answered sensibly** when what the assistant said has one of its accepted answers ("answer"), as a
  whole word, numbers read either way ("8" or "eight"), in at most ``MAX_WORDS`` words (a ramble that
  mentions the answer somewhere does not count).

``--set voices`` asks the second set (tests/fixtures/demo-voices/): 20 other questions, each in another
espeak-ng or piper voice (scripts/make_demo_questions.py). ``--text`` asks the same questions as text
(conversation.item.create, then response.create): the LLM alone, without the STT. ``--voice piper`` speaks
them with piper's en_US "joe" voice (the local extra's, also the demo's own voice) instead of the committed
WAVs: a voice nearer to a person's, which whisper hears better. ``--runs N`` repeats the set (sampling makes
answers differ from run to run).

    flock /work/wt/bench.lock .venv/bin/python scripts/bench_demo.py [--set voices] [--runs 3] [--text] \
        [--json out.json]
    .venv/bin/python scripts/bench_demo.py --url ws://127.0.0.1:8000/v1/realtime   # a gateway already running

Without ``--url`` it starts ``python -m gateway serve`` from this checkout (the package's default configuration;
GATEWAY_* variables apply) on a free port, and stops it at the end; ``--repo DIR`` serves another checkout
of the project instead (with this interpreter), e.g. an older commit's export for a before/after figure.
``--json`` writes every answer with what makes the record self-describing: the machine and its load, the
date, the served checkout's commit, the command, the GATEWAY_* variables and the models the gateway names.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path
from typing import Any

import websockets

ROOT = Path(__file__).resolve().parent.parent
SETS = {"demo": ROOT / "tests" / "fixtures" / "demo", "voices": ROOT / "tests" / "fixtures" / "demo-voices"}
TAIL_MS = 1500  # silence after the question: the turn ends within it
MAX_WORDS = 40
NUMBERS = {str(n): word for n, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())} | {
    "24": "twenty-four", "60": "sixty", "100": "hundred"}


def words(text: str) -> list[str]:
    return [NUMBERS.get(w, w) for w in re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", text.lower())]


def heard_right(question: dict[str, Any], transcript: str) -> bool:
    got = set(words(transcript))
    return all(w in got for w in question["heard"])


def sensible(question: dict[str, Any], said: str) -> bool:
    said_words = words(said)
    joined = " " + " ".join(said_words) + " "
    return len(said_words) <= MAX_WORDS and any(f" {a} " in joined for a in question["answer"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(repo: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "GATEWAY_SERVER_PORT": str(port), "GATEWAY_WEBRTC_ENABLED": "false",
           "PYTHONPATH": str(repo)}
    process = subprocess.Popen([sys.executable, "-m", "gateway", "serve"], cwd=repo, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                if json.loads(answer.read())["status"] in ("ok", "degraded"):
                    return process, f"ws://127.0.0.1:{port}/v1/realtime"
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit("the gateway did not start")


def committed_pcm(folder: Path) -> Any:
    def pcm(question: dict[str, Any]) -> bytes:
        with wave.open(str(folder / question["file"])) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
            return w.readframes(w.getnframes())
    return pcm


def commit(repo: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None  # an exported tree


def piper_voice() -> Any:
    from gateway.responders.piper_tts import PiperEngine

    engine = PiperEngine()
    return lambda question: bytes(48 * 300) + engine.synthesize(question["question"]) + bytes(48 * 300)


async def ask(url: str, question: dict[str, Any], text: bool, speak: Any) -> dict[str, Any]:
    """One question in a session of its own: what was heard, what was said, and the first audio's latency."""
    async with websockets.connect(url, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
            "input": {"transcription": {"model": "whisper-1"}}}}}))
        if text:
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": question["question"]}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
        else:
            pcm = speak(question) + bytes(48 * TAIL_MS)
            for i in range(0, len(pcm), 9600):  # 200 ms a message, as fast as the gateway takes them
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(pcm[i:i + 9600]).decode()}))
        heard, said, stopped, first = (question["question"] if text else ""), "", None, None
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 120))
            kind = event["type"]
            if kind == "conversation.item.input_audio_transcription.completed":
                heard = event["transcript"]
            elif kind == "input_audio_buffer.speech_stopped":
                stopped = time.monotonic()
            elif kind == "response.output_audio.delta" and first is None:
                first = time.monotonic()
            elif kind == "error":
                raise RuntimeError(event["error"]["message"])
            elif kind == "response.done":
                response = event["response"]
                said = " ".join(part.get("transcript") or part.get("text") or "" for item in response["output"]
                                for part in item.get("content", []))
                break
        if not text and not heard:  # the transcript may come after the response when the STT is slow
            while not heard:
                event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if event["type"] == "conversation.item.input_audio_transcription.completed":
                    heard = event["transcript"]
    return {"file": question["file"], "question": question["question"], "heard": heard, "said": said.strip(),
            "heard_right": heard_right(question, heard), "sensible": sensible(question, said),
            "first_audio_ms": None if first is None or stopped is None else round((first - stopped) * 1000)}


async def run(url: str, questions: list[dict[str, Any]], text: bool, speak: Any) -> list[dict[str, Any]]:
    results = []
    for question in questions:
        result = await ask(url, question, text, speak)
        mark = "ok " if result["sensible"] else "-- "
        print(f"{mark} {result['question']:50.50} heard {result['heard']!r:45.45} said {result['said']!r:.70}",
              flush=True)
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running gateway's Realtime WebSocket (default: start one)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout to serve when no --url is given")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--text", action="store_true", help="ask in text: the LLM alone, without the STT")
    parser.add_argument("--set", choices=SETS, default="demo",
                        help="the questions: demo (espeak-ng, default) or voices (other voices)")
    parser.add_argument("--voice", choices=("espeak", "piper"), default="espeak",
                        help="the set's committed WAVs (default; named for the demo set's voice), or piper's voice "
                             "made now")
    parser.add_argument("--json", type=Path, help="write every answer and the figures here")
    args = parser.parse_args()
    questions = json.loads((SETS[args.set] / "questions.json").read_text())
    speak = piper_voice() if args.voice == "piper" else committed_pcm(SETS[args.set])
    load_before = os.getloadavg()
    process, url = (None, args.url) if args.url else serve(args.repo.resolve())
    with urllib.request.urlopen(url.replace("ws", "http", 1).replace("/v1/realtime", "/healthz"), timeout=5) as r:
        models = json.loads(r.read())["responder"]
    runs = []
    try:
        for n in range(args.runs):
            print(f"run {n + 1} of {args.runs} against {url} ({'text' if args.text else args.voice})", flush=True)
            runs.append(asyncio.run(run(url, questions, args.text, speak)))
    finally:
        if process is not None:
            process.send_signal(signal.SIGINT)
            process.wait(30)
    sensible_counts = [sum(r["sensible"] for r in results) for results in runs]
    heard_counts = [sum(r["heard_right"] for r in results) for results in runs]
    latencies = sorted(r["first_audio_ms"] for results in runs for r in results if r["first_audio_ms"] is not None)
    median = latencies[len(latencies) // 2] if latencies else None
    print(f"answered sensibly: {sensible_counts} of {len(questions)} per run; heard right: {heard_counts}; "
          f"speech_stopped -> first audio median {median} ms "
          f"({platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    if args.json:
        figures = {
            "benchmark": "demo answers", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": {"host": platform.node(), "cpus": os.cpu_count(), "processor": platform.processor(),
                        "python": platform.python_version(), "load_before": load_before,
                        "load_after": os.getloadavg()},
            "commit": None if args.url else commit(args.repo.resolve()), "command": sys.argv,
            "environment": {k: v for k, v in os.environ.items() if k.startswith("GATEWAY_")},
            "responder": models, "url": url, "set": args.set, "text": args.text, "voice": args.voice,
            "questions": len(questions), "sensible": sensible_counts, "heard_right": heard_counts,
            "first_audio_median_ms": median, "runs": runs}
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
