"""End-of-turn detection on recorded turns: semantic_vad (Smart Turn) at each eagerness against server_vad.

Usage::

    python scripts/make_turns.py            # once: the turns, in artifacts/turns
    python scripts/bench_turns.py [--turns artifacts/turns] [--server-silence 200,500,1000] [--recheck-ms 0,500]

The detectors are the gateway's own (gateway.core.vad.TurnDetector,
gateway.core.semantic_vad.SemanticTurnDetector with the [semantic_vad] settings of config.toml) on the
real Silero and Smart Turn models, fed each turn's audio window by window. A turn's end is decided at a
point of its audio, so the figures are the same on any machine; the model's time is measured here and
reported beside them.

- premature: turns committed before their true end of speech (a commit inside the utterance: the
  user was cut off), out of the paused / complete turns.
- delay: from the true end of speech to the commit, in audio time (silence heard before deciding)
  plus, when a verdict ended the turn, the model's CPU time for that check (on an idle core, its latency).
- verdicts: the model's P(complete) at the pauses inside sentences (should be low) and at their ends
  (should be high).
- CPU per inference: features + model for one turn, alone and in batches, on this thread.
"""

from __future__ import annotations

import argparse
import json
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gateway.config import load_config
from gateway.core.semantic_vad import CheckTurn, Eagerness, SemanticTurnDetector, eagerness_levels
from gateway.core.vad import SpeechStopped, TurnDetector
from gateway.runtime.silero import SileroModel, SileroVAD
from gateway.runtime.smart_turn import SmartTurnModel, features

BYTES_PER_MS = 48
TOLERANCE_MS = 100  # a commit ending this close to the true end is not a cut-off


@dataclass
class Turn:
    name: str
    voice: str
    kind: str
    pcm: bytes
    start_ms: int
    end_ms: int
    pauses_ms: list[list[int]]
    probs: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass
class Outcome:
    commits: list[tuple[int, int]]  # (audio_end_ms, decided at ms of audio)
    model_ms: float = 0.0  # CPU time of the check that ended the turn, if a verdict did


class Verdicts:
    """The model's answers, computed once per distinct audio span and timed."""

    def __init__(self, model: SmartTurnModel) -> None:
        self.model = model
        self.cache: dict[tuple[str, int, int], tuple[float, float]] = {}

    def __call__(self, turn: Turn, check: CheckTurn) -> tuple[float, float]:
        key = (turn.name, check.start_ms, check.end_ms)
        if key not in self.cache:
            pcm = turn.pcm[check.start_ms * BYTES_PER_MS : check.end_ms * BYTES_PER_MS]
            t = time.thread_time()
            p = float(self.model.predict([pcm])[0])
            self.cache[key] = (p, (time.thread_time() - t) * 1000)
        return self.cache[key]


def run_server_vad(turn: Turn, silence_ms: int) -> Outcome:
    detector = TurnDetector(silence_duration_ms=silence_ms)
    commits = []
    for p in turn.probs:
        for ev in detector.feed((p,)):
            if isinstance(ev, SpeechStopped):
                commits.append((ev.audio_end_ms, detector.position_ms))
    return Outcome(commits)


def run_semantic(turn: Turn, eagerness: Eagerness, pause_ms: int, recheck_ms: int, verdicts: Verdicts) -> Outcome:
    detector = SemanticTurnDetector(TurnDetector(), eagerness, pause_ms, recheck_ms)
    outcome = Outcome([])
    events: list = []
    for p in turn.probs:
        events += detector.feed((p,))
        while events:
            ev = events.pop(0)
            if isinstance(ev, CheckTurn):
                prob, cpu_ms = verdicts(turn, ev)
                after = detector.verdict(ev.seq, prob)
                if after and isinstance(after[0], SpeechStopped):
                    outcome.model_ms = cpu_ms  # this verdict ended the turn
                events += after
            elif isinstance(ev, SpeechStopped):
                outcome.commits.append((ev.audio_end_ms, detector.position_ms))
    return outcome


def summarize(name: str, turns: list[Turn], outcomes: list[Outcome]) -> str:
    cut = {"paused": 0, "complete": 0}
    delays = []
    for turn, outcome in zip(turns, outcomes, strict=True):
        if any(end < turn.end_ms - TOLERANCE_MS for end, _ in outcome.commits):
            cut[turn.kind] += 1
        final = [at for end, at in outcome.commits if end >= turn.end_ms - TOLERANCE_MS]
        if final:
            delays.append(final[0] - turn.end_ms + outcome.model_ms)
    n_paused = sum(t.kind == "paused" for t in turns)
    n_complete = len(turns) - n_paused
    d = np.array(delays)
    return (f"| {name} | {cut['paused']} / {n_paused} | {cut['complete']} / {n_complete} | "
            f"{np.median(d):.0f} | {np.percentile(d, 90):.0f} | {d.max():.0f} | {len(turns) - len(d)} |")


def load_turns(folder: Path) -> list[Turn]:
    manifest = json.loads((folder / "turns.json").read_text())
    turns = []
    for name, record in manifest.items():
        with wave.open(str(folder / name)) as w:
            pcm = w.readframes(w.getnframes())
        turns.append(Turn(name, record["voice"], record["kind"], pcm, *record["speech_ms"], record["pauses_ms"]))
    return turns


def cpu_per_inference(model: SmartTurnModel, turns: list[Turn]) -> None:
    pcm = turns[0].pcm[: turns[0].end_ms * BYTES_PER_MS]
    model.predict([pcm])  # warm-up
    t = np.empty(10)
    for i in range(len(t)):
        start = time.thread_time()
        features(pcm)
        t[i] = time.thread_time() - start
    print(f"features (resample + log-mel), one turn: median {np.median(t) * 1000:.1f} ms CPU")
    for batch in (1, 2, 4, 8, 16):
        feats = np.stack([features(pcm)] * batch)
        t = np.empty(5)
        for i in range(len(t)):
            start = time.thread_time()
            model.infer(feats)
            t[i] = time.thread_time() - start
        print(f"model, batch {batch:2d}: median {np.median(t) * 1000 / batch:6.1f} ms CPU per turn "
              f"({np.median(t) * 1000:.0f} ms per call)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_turns = Path(__file__).resolve().parent.parent / "artifacts" / "turns"
    parser.add_argument("--turns", type=Path, default=default_turns)
    parser.add_argument("--server-silence", default="200,500,1000", help="server_vad silence_duration_ms values")
    parser.add_argument("--recheck-ms", default="0,500", help="semantic_vad recheck_ms values")
    args = parser.parse_args()
    if not (args.turns / "turns.json").exists():
        parser.error(f"no turns in {args.turns}: run python scripts/make_turns.py first")

    cfg = load_config().semantic_vad
    levels = eagerness_levels(cfg)
    turns = load_turns(args.turns)
    silero = SileroModel()
    for turn in turns:
        turn.probs = SileroVAD(silero).process(turn.pcm)
    model = SmartTurnModel(cfg.model_path or None, cfg.model_sha256 or None)
    verdicts = Verdicts(model)

    print(f"{len(turns)} turns from {args.turns}; [semantic_vad] pause_ms {cfg.pause_ms}, "
          + ", ".join(f"{k}: threshold {e.threshold}, max wait {e.max_wait_ms} ms" for k, e in levels.items()
                      if k != "auto"))
    for voice in dict.fromkeys(t.voice for t in turns):
        group = [t for t in turns if t.voice == voice]
        print(f"\n{voice}:\n\n| detector | premature: paused turns cut | complete turns cut | delay P50 ms | P90 ms "
              "| max ms | never committed |\n|---|---|---|---|---|---|---|")
        for silence in map(int, args.server_silence.split(",")):
            print(summarize(f"server_vad, silence {silence} ms", group, [run_server_vad(t, silence) for t in group]))
        for recheck in map(int, args.recheck_ms.split(",")):
            for level in ("high", "medium", "low"):
                outcomes = [run_semantic(t, levels[level], cfg.pause_ms, recheck, verdicts) for t in group]
                label = f"semantic_vad, {level}" + (f", recheck {recheck} ms" if recheck else "")
                print(summarize(label, group, outcomes))

        # What the model says at a pause inside a sentence and at the end of a turn, pause_ms into the silence.
        def p_complete(turn: Turn, end_ms: int) -> float:
            start = turn.start_ms - 300  # as the detector takes it: prefix_padding_ms before the speech
            return float(model.predict([turn.pcm[start * BYTES_PER_MS : (end_ms + cfg.pause_ms) * BYTES_PER_MS]])[0])

        inside = np.array([p_complete(t, a) for t in group for a, _ in t.pauses_ms])
        ends = np.array([p_complete(t, t.end_ms) for t in group])
        print(f"\nP(complete) {cfg.pause_ms} ms into a pause inside a sentence: median {np.median(inside):.2f}, "
              f"below 0.5 (incomplete) at {np.sum(inside < 0.5)} of {len(inside)} pauses")
        print(f"P(complete) {cfg.pause_ms} ms after the end of a turn: median {np.median(ends):.2f}, "
              f"at or above 0.5 (complete) at {np.sum(ends >= 0.5)} of {len(ends)} turns")
    print()
    cpu_per_inference(model, turns)


if __name__ == "__main__":
    main()
