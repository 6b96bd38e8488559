"""Make the recorded turns that `python -m bench turns` measures end-of-turn detection on.

Usage::

    python -m scripts.make_turns [--out artifacts/turns]

Each turn is one user utterance, 0.5 s of silence before it and 10 s after (longer than the longest
wait of semantic_vad, 8 s at eagerness low), pcm16 mono 24 kHz at -20 dBFS RMS. Two kinds:

- ``paused``: a sentence with one or two pauses inside it, where a speaker hesitates ("I'd like to book
  a table for ... four people."). Pauses cycle through 0.4, 0.7, 1.0 and 1.5 s.
- ``complete``: a sentence with no pause.

Two voices, since Smart Turn judges the prosody (the melody and timing of the speech) more than the
words:

- ``espeak``: espeak-ng (voice en-us, 170 words per minute, as scripts/make_fixtures.py). The whole
  sentence is one utterance with SSML ``<break time="..."/>`` at the pauses, so the words before a
  pause carry the sentence's running intonation, not the fall of a finished sentence (fragments spoken
  on their own would each sound finished).
- ``festival``: Festival's CMU US SLT HTS voice, a statistical voice trained on a recorded speaker,
  closer to natural prosody; skipped unless installed (``apt-get install festival festvox-us-slt-hts``).
  The sentence is spoken whole, then cut at the word boundaries Festival reports and the pauses inserted
  there: the speaker stops mid-sentence, in mid-melody.

``turns.json`` records, per file, the voice, the text, the speech's start and true end (``speech_ms``)
and each pause (``pauses_ms``: [start, end] of the silent gaps inside the sentence), in milliseconds.
The output is identical from run to run with the same synthesizers (eSpeak NG 1.51 and Festival 2.5.0
with festvox-us-slt-hts 0.2010.10.25 here).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np
import soxr

from scripts.make_fixtures import RATE, SPEECH_RMS_DBFS, gaps, silence, speak, write_wav

PAUSES_MS = (400, 700, 1000, 1500)
LEAD_MS = 500
TAIL_MS = 10_000
# "|" marks a pause inside the sentence.
PAUSED = [
    "I'd like to book a table for | four people.",
    "I want to fly from Boston to | Denver on Friday.",
    "What's the best way to | get to the airport?",
    "Can you remind me to | call my mother tomorrow?",
    "My phone number is | five five five, | one two three four.",
    "So I was thinking that maybe we could | go to the beach on Saturday.",
    "Please turn off the | lights in the kitchen.",
    "The meeting is at | three o'clock.",
    "I need to | buy some milk and eggs.",
    "Could you tell me what the weather | will be like tomorrow?",
    "I'm looking for a | good Italian restaurant nearby.",
    "Send a message to | Sarah saying that | I will be late.",
    "Set an alarm for | seven thirty in the morning.",
    "How long does it take to | drive from here to Chicago?",
    "I would like to order a | large pizza with mushrooms.",
    "Add eggs, | milk and | bread to my shopping list.",
    "What is the capital of | Australia?",
    "Play some music by | the Beatles.",
    "Tell me a joke about | cats.",
    "I think the problem is that | the printer is out of paper.",
    "Can you explain how | photosynthesis works?",
    "My flight number is | United four five six.",
    "We should probably leave before | the traffic gets bad.",
    "The package was supposed to arrive on | Tuesday, but it never came.",
]
COMPLETE = [
    "I'd like to book a table for four people.",
    "What time does the pharmacy close today?",
    "Thank you, that's all I needed.",
    "Turn the volume up a little.",
    "How far is the nearest gas station?",
    "I don't think that's right.",
    "Please cancel my appointment for tomorrow.",
    "What's the weather like in Paris?",
    "Call my sister.",
    "Yes, that sounds good to me.",
    "Can you recommend a good book?",
    "I'm going to be about ten minutes late.",
    "Order a taxi to the train station.",
    "Is it going to rain this weekend?",
    "No, I meant the other one.",
    "Read me my last three emails.",
]


def espeak_turn(parts: list[str], pauses: list[int]) -> tuple[np.ndarray, list[list[int]]]:
    """The sentence with SSML breaks; the pauses as measured in the audio."""
    ssml = parts[0] + "".join(f' <break time="{ms}ms"/> {p}' for ms, p in zip(pauses, parts[1:], strict=True))
    speech = speak(ssml, ssml=True)
    found = gaps(speech, min(PAUSES_MS) - 100)
    if len(found) != len(pauses):
        raise RuntimeError(f"expected {len(pauses)} pauses in {parts}, found {found}")
    return speech, found


def festival(text: str) -> tuple[np.ndarray, list[tuple[str, float]]]:
    """Festival's SLT HTS voice → float64 at 24 kHz, and each word with its end time in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        script = Path(tmp) / "say.scm"
        script.write_text(
            f"(voice_cmu_us_slt_arctic_hts)\n(set! utt (Utterance Text {json.dumps(text)}))\n(utt.synth utt)\n"
            f'(utt.save.wave utt "{wav}" \'riff)\n'
            '(mapcar (lambda (w) (format t "%s %f\\n" (item.name w) (item.feat w "word_end")))'
            " (utt.relation.items utt 'Word))\n"
        )
        out = subprocess.run(["festival", "-b", str(script)], capture_output=True, text=True, check=True).stdout
        with wave.open(str(wav), "rb") as w:
            rate = w.getframerate()
            x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
    words = [(name, float(end)) for name, end in (line.split() for line in out.strip().splitlines())]
    return soxr.resample(x, rate, RATE, quality="HQ"), words


def festival_turn(parts: list[str], pauses: list[int]) -> tuple[np.ndarray, list[list[int]]]:
    """The sentence spoken whole, cut after the last word of each part, the pauses inserted there."""
    x, words = festival(" ".join(parts))

    def letters(s: str) -> str:
        return re.sub(r"[^a-z]", "", s.lower())

    cuts, i = [], 0
    for part in parts[:-1]:  # Festival may split a token ("what's" → "what" "'s"): match by letters
        target, spoken = letters(part), ""
        while spoken != target:
            spoken += letters(words[i][0])
            i += 1
        cuts.append(round(words[i - 1][1] * RATE))
    loud = np.nonzero(np.abs(x) > 0.01 * np.abs(x).max())[0]
    bounds = [loud[0], *cuts, loud[-1] + 1]
    pieces, found, pos = [], [], 0
    for k in range(len(bounds) - 1):
        pieces.append(x[bounds[k] : bounds[k + 1]])
        pos += bounds[k + 1] - bounds[k]
        if k < len(pauses):
            pieces.append(silence(pauses[k]))
            found.append([round(pos * 1000 / RATE), round(pos * 1000 / RATE) + pauses[k]])
            pos += len(pieces[-1])
    speech = np.concatenate(pieces)
    level = 10 ** (SPEECH_RMS_DBFS / 20) / np.sqrt(np.mean(x[loud[0] : loud[-1] + 1] ** 2))
    return speech * level, found


def record(voice: str, parts: list[str], speech: np.ndarray, pauses: list[list[int]]) -> dict:
    return {
        "voice": voice,
        "kind": "paused" if len(parts) > 1 else "complete",
        "text": " ".join(parts),
        "speech_ms": [LEAD_MS, LEAD_MS + round(len(speech) * 1000 / RATE)],
        "pauses_ms": [[LEAD_MS + a, LEAD_MS + b] for a, b in pauses],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_out = Path(__file__).resolve().parent.parent / "artifacts" / "turns"
    parser.add_argument("--out", type=Path, default=default_out)
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    voices = {"espeak": espeak_turn}
    if shutil.which("festival"):
        voices["festival"] = festival_turn
    else:
        print("festival not found: espeak-ng turns only (apt-get install festival festvox-us-slt-hts)")
    manifest = {}
    for voice, make in voices.items():
        cycle = itertools.cycle(PAUSES_MS)
        for i, text in enumerate(PAUSED + COMPLETE):
            parts = [p.strip() for p in text.split("|")]
            speech, pauses = make(parts, [next(cycle) for _ in parts[1:]])
            turn = record(voice, parts, speech, pauses)
            name = f"{voice}_{turn['kind']}_{i:02d}.wav"
            write_wav(out / name, np.concatenate([silence(LEAD_MS), speech, silence(TAIL_MS)]))
            manifest[name] = turn
            print(f"{name}: {turn['text']!r}, speech {turn['speech_ms']}, pauses {turn['pauses_ms']}")
    (out / "turns.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
