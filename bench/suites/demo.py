"""How many of the demo's 20 spoken questions a gateway answers sensibly (tests/fixtures/demo/, or --set voices).

Each question is asked in a session of its own, over WebSocket as a client would: its WAV, then silence until
the gateway's turn detection ends the turn. A question counts as

- heard when the transcript of the turn has every word listed for it in questions.json ("heard");
- answered sensibly when what the assistant said has one of its accepted answers ("answer"), as a whole word,
  numbers read either way ("8" or "eight"), in at most MAX_WORDS words (a ramble that mentions the answer
  somewhere does not count).

--set voices asks the second set (tests/fixtures/demo-voices/): 20 other questions, each in another espeak-ng or
piper voice (scripts/make_demo_questions.py). --text asks the same questions as text (conversation.item.create,
then response.create): the LLM alone, without the STT. --voice piper speaks them with piper's en_US "joe" voice
(the local extra's, the demo's own voice) instead of the committed WAVs. --runs N repeats the set. Without --url
it serves the gateway with the package's default configuration (the local models where the local extra is
installed).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import re
import time
from pathlib import Path
from typing import Any

from bench.launcher import Gateway, bench_settings, free_port
from bench.load import FIXTURES

HELP = "the demo's 20 spoken questions to the local models, answered sensibly or not"
HOW = """\
    python -m bench demo --small                 # the first 3 questions, one run
    python -m bench demo --runs 3                # spoken by espeak-ng (the committed WAVs)
    python -m bench demo --voice piper           # spoken by piper's voice; --text: typed, the LLM alone
    python -m bench demo --url ws://127.0.0.1:8000/v1/realtime   # a gateway already running"""
SETS = {"demo": FIXTURES / "demo", "voices": FIXTURES / "demo-voices"}
TAIL_MS = 1500  # silence after the question: the turn ends within it
MAX_WORDS = 40
NUMBERS = {str(n): word for n, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())} | {
    "24": "twenty-four", "60": "sixty", "100": "hundred"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="a running gateway's Realtime WebSocket (default: start one)")
    parser.add_argument("--set", choices=tuple(SETS), default="demo", dest="question_set",
                        help="the espeak-ng set (default) or the set in other voices")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--questions", type=int, help="ask the first N questions only (default all; --small 3)")
    parser.add_argument("--text", action="store_true", help="ask in text: the LLM alone, without the STT")
    parser.add_argument("--voice", choices=("espeak", "piper"), default="espeak",
                        help="the committed espeak-ng WAVs (default), or piper's voice made now")


def words(text: str) -> list[str]:
    return [NUMBERS.get(w, w) for w in re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", text.lower())]


def heard_right(question: dict[str, Any], transcript: str) -> bool:
    got = set(words(transcript))
    return all(w in got for w in question["heard"])


def sensible(question: dict[str, Any], said: str) -> bool:
    said_words = words(said)
    joined = " " + " ".join(said_words) + " "
    return len(said_words) <= MAX_WORDS and any(f" {a} " in joined for a in question["answer"])


def committed_pcm(folder: Path, question: dict[str, Any]) -> bytes:
    import wave

    with wave.open(str(folder / question["file"])) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return w.readframes(w.getnframes())


def piper_voice() -> Any:
    from gateway.responders.piper_tts import PiperEngine

    engine = PiperEngine()
    return lambda question: bytes(48 * 300) + engine.synthesize(question["question"]) + bytes(48 * 300)


async def ask(url: str, question: dict[str, Any], text: bool, speak: Any) -> dict[str, Any]:
    """One question in a session of its own: what was heard, what was said, and the first audio's latency."""
    import websockets

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


async def ask_all(url: str, questions: list[dict[str, Any]], text: bool, speak: Any) -> list[dict[str, Any]]:
    results = []
    for question in questions:
        result = await ask(url, question, text, speak)
        mark = "ok " if result["sensible"] else "-- "
        print(f"{mark} {result['question']:50.50} heard {result['heard']!r:45.45} said {result['said']!r:.70}",
              flush=True)
        results.append(result)
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = SETS[args.question_set]
    questions = json.loads((folder / "questions.json").read_text())
    count = args.questions or (3 if args.small else len(questions))
    questions = questions[:count]
    speak = piper_voice() if args.voice == "piper" and not args.text else functools.partial(committed_pcm, folder)
    gateway = None if args.url else Gateway(bench_settings(free_port()))
    url = args.url or (gateway.url if gateway else "")
    mode = ("typed" if args.text else f"spoken, {args.voice}") + f", the {args.question_set} set"
    levels = []
    try:
        for n in range(args.runs):
            print(f"run {n + 1} of {args.runs} against {url} ({mode})", flush=True)
            results = asyncio.run(ask_all(url, questions, args.text, speak))
            latencies = sorted(r["first_audio_ms"] for r in results if r["first_audio_ms"] is not None)
            levels.append({"run": n + 1, "mode": mode, "questions": len(questions),
                           "sensible": sum(r["sensible"] for r in results),
                           "heard_right": sum(r["heard_right"] for r in results),
                           "first_audio_median_ms": latencies[len(latencies) // 2] if latencies else None,
                           "answers": results, "valid": None, "invalid": []})
            print(f"answered sensibly: {levels[-1]['sensible']} of {len(questions)}; heard right: "
                  f"{levels[-1]['heard_right']}", flush=True)
    finally:
        if gateway is not None:
            gateway.stop()
    return {"setup": f"{mode}, {len(questions)} questions", "settings": {
        "url": args.url or "the package's default configuration", "runs": args.runs, "questions": len(questions),
        "text": args.text, "voice": args.voice, "set": args.question_set, "max_words": MAX_WORDS}, "levels": levels}
