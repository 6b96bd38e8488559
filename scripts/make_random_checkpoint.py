"""A Qwen3-TTS 12Hz checkpoint of real geometry with seeded random weights, written by the engine's own modules.

    python -m scripts.make_random_checkpoint --config real-0.6b --out /tmp/q06 [--seed 1234]

What the GPU benchmarks load where only the geometry matters (speed, memory, capacity): the same config.json,
speech tokenizer config and tokenizer files as scripts/make_parity_fixture.py writes for --config (every kind
it knows: real-0.6b, real-1.7b, real-0.6b-base, real-1.7b-base, real-1.7b-design), but no official code is
needed to make it, and no greedy references are recorded: parity is make_parity_fixture.py's. The weights are
the engine's own parameters (engine.talker, engine.codec, engine.speaker, engine.encoder), named as the
official checkpoints name them, so the engine loads the folder as it loads a published one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.codec import CodecDecoder
from engine.encoder import SpeechEncoder
from engine.speaker import SpeakerEncoder, SpeakerEncoderConfig
from engine.talker import ModelConfig, Qwen3TTS
from scripts.make_parity_fixture import CONFIGS, build_tokenizer, model_config, randomize

GENERATION = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
              "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
              "subtalker_top_k": 50, "max_new_tokens": 8192}


@torch.no_grad()
def write(config_name: str, out: Path, seed: int) -> None:
    (out / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    config, speech = model_config(config_name, build_tokenizer(out))
    predictor = config["talker_config"]["code_predictor_config"]
    predictor.setdefault("head_dim", 128)
    model = Qwen3TTS(ModelConfig.from_dict(config))
    randomize(model, seed)
    weights = dict(model.state_dict())
    codec = CodecDecoder.from_config(speech)
    randomize(codec, seed + 1)
    speech_weights = dict(codec.state_dict())
    if config["tts_model_type"] == "base":
        speaker = SpeakerEncoder(SpeakerEncoderConfig.from_dict(config["speaker_encoder_config"]))
        randomize(speaker, seed + 2)
        weights |= {f"speaker_encoder.{k}": v for k, v in speaker.state_dict().items()}
        encoder = SpeechEncoder.from_config(speech)
        randomize(encoder, seed + 3)
        speech_weights |= {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"))
    save_file({k: v.contiguous() for k, v in speech_weights.items()},
              str(out / "speech_tokenizer" / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts", **config}, indent=2))
    (out / "generation_config.json").write_text(json.dumps(GENERATION, indent=2))
    (out / "speech_tokenizer" / "config.json").write_text(json.dumps(speech, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, choices=sorted(c for c in CONFIGS if c.startswith("real")))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    start = time.perf_counter()
    write(args.config, args.out, args.seed)
    print(f"wrote {args.out} ({args.config}, random weights) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
