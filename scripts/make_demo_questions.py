"""Regenerate the demo's 20 spoken questions in tests/fixtures/demo/ (the WAVs are committed; tests never run this).

The fixed set that `python -m bench demo` asks the gateway (and tests/responders/test_local.py asks the local
STT): simple questions with a one-word answer, each with the words that make an answer sensible. Spoken by
espeak-ng (``apt-get install espeak-ng``; made with eSpeak NG 1.51 from Debian 12, voice en-us, 160 words per
minute), as scripts/make_fixtures.py speaks the other fixtures. Usage::

    python -m scripts.make_demo_questions [--out tests/fixtures/demo]

Each WAV is pcm16 mono 24 kHz: 0.3 s of silence, the question at -20 dBFS RMS, 0.3 s of silence (a client adds
the silence that ends the turn). questions.json lists, per file, the question, the words that show it was
heard ("heard": each must be in the transcript) and those that make an answer sensible ("answer": any one).
"""

from __future__ import annotations

import argparse
import json
import wave
from pathlib import Path

import numpy as np

from scripts.make_fixtures import RATE, silence, speak

# (file stem, question, words heard, answers accepted); numbers in digits or words (the demo suite spells them).
QUESTIONS = [
    ("spider", "How many legs does a spider have?", ["legs", "spider"], ["eight"]),
    ("france", "What is the capital of France?", ["capital", "france"], ["paris"]),
    ("sky", "What color is the sky on a clear day?", ["color", "sky"], ["blue"]),
    ("week", "How many days are in a week?", ["days", "week"], ["seven"]),
    ("sum", "What is two plus two?", ["two", "plus"], ["four"]),
    ("bees", "What do bees make?", ["bees", "make"], ["honey"]),
    ("planet", "What is the largest planet in our solar system?", ["largest", "planet"], ["jupiter"]),
    ("ice", "What do we call frozen water?", ["frozen", "water"], ["ice"]),
    ("hours", "How many hours are in a day?", ["hours", "day"], ["twenty-four", "twentyfour", "twenty four"]),
    ("cow", "Which animal says moo?", ["animal"], ["cow", "cows"]),
    ("hot", "What is the opposite of hot?", ["opposite", "hot"], ["cold"]),
    ("earth", "Which planet do we live on?", ["planet", "live"], ["earth"]),
    ("banana", "What color is a ripe banana?", ["color", "banana"], ["yellow"]),
    ("months", "How many months are in a year?", ["months", "year"], ["twelve"]),
    ("japan", "What is the capital of Japan?", ["capital", "japan"], ["tokyo"]),
    ("oxygen", "Which gas do people need to breathe?", ["gas", "breathe"], ["oxygen"]),
    ("boil", "At what temperature in Celsius does water boil?", ["water", "boil"], ["hundred", "one hundred"]),
    ("shakespeare", "Who wrote Romeo and Juliet?", ["romeo", "juliet"], ["shakespeare"]),
    ("triangle", "How many sides does a triangle have?", ["sides", "triangle"], ["three"]),
    ("grass", "What color is grass?", ["color", "grass"], ["green"]),
]
PAD_MS = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/demo")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    listing = []
    for stem, question, heard, answers in QUESTIONS:
        audio = np.concatenate([silence(PAD_MS), speak(question, rate_wpm=160), silence(PAD_MS)])
        pcm = (np.clip(audio, -1, 1) * 32767).round().astype("<i2").tobytes()
        name = f"{stem}.wav"
        with wave.open(str(args.out / name), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes(pcm)
        listing.append({"file": name, "question": question, "heard": heard, "answer": answers})
    (args.out / "questions.json").write_text(json.dumps(listing, indent=2) + "\n")
    print(f"wrote {len(listing)} questions to {args.out}")


if __name__ == "__main__":
    main()
