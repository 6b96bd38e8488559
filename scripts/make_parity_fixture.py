"""Build a Qwen3-TTS 12Hz checkpoint with seeded random weights through the OFFICIAL code, and record
what the official implementation produces from it: the parity oracle for engine/.

It runs in its own virtualenv, because qwen-tts pins transformers 4.57.3 (the gateway uses 5.x):

    python3.11 -m venv /work/oracle-venv && . /work/oracle-venv/bin/activate
    pip install torch==2.13.0
    pip install transformers==4.57.3 accelerate==1.12.0 einops soundfile librosa onnxruntime
    pip install --no-deps qwen-tts==0.1.1
    python -m scripts.make_parity_fixture --out tests/data/qwen3_tts_tiny            # the committed fixtures
    python -m scripts.make_parity_fixture --config tiny-base --out tests/data/qwen3_tts_tiny_base
    python -m scripts.make_parity_fixture --config tiny-design --out tests/data/qwen3_tts_tiny_design
    python -m scripts.make_parity_fixture --config tiny-instruct --out tests/data/qwen3_tts_tiny_instruct
    python -m scripts.make_parity_fixture --config real-0.6b --out /tmp/q06 --device cuda   # real size
    python -m scripts.make_parity_fixture --config real-1.7b-base --out /tmp/q17b --device cuda

--config names a geometry (tiny, real-0.6b, real-1.7b) and a kind (CustomVoice unless -base: voice cloning,
-design: VoiceDesign, -instruct: a tiny CustomVoice labelled 1.7B, which follows instructions); see CONFIGS.
The checkpoint is written in the Hugging Face layout of the published Qwen/Qwen3-TTS-12Hz-* checkpoints
(config.json, generation_config.json, model.safetensors, vocab.json/merges.txt/tokenizer_config.json,
speech_tokenizer/{config.json,preprocessor_config.json,model.safetensors}); the text tokenizer is a small
byte-level BPE trained here on a few sentences (the real one is Qwen2's 151k BPE, which cannot be fetched).
references.json holds the official greedy codes per prompt; references.safetensors the waveforms, and for
Base the speaker embeddings and encoder codes of a reference recording (README.md in the output says which).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import math
import sys
import time
import types
from pathlib import Path

import torch

from scripts.make_codec_reference import randomize_ as randomize_decoder


def _stub_unused_audio_modules() -> None:
    """`import qwen_tts` pulls the 25Hz tokenizer chain, which imports sox and torchaudio's kaldi
    features; neither is used by the 12Hz model and neither installs here (no CPU torchaudio)."""
    for name in ("sox", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        if name in sys.modules:
            continue
        try:
            __import__(name)
        except Exception:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
            module.__path__ = []  # a package, so the submodules resolve
            sys.modules[name] = module


# Real-size geometry from the published config.json of Qwen3-TTS-12Hz-0.6B-CustomVoice and of its
# speech_tokenizer/config.json. Qwen3-TTS-12Hz-1.7B-CustomVoice differs only in the talker's width (hidden
# 2048, intermediate 6144; 28 layers, 16 query / 8 key-value heads of 128 as in 0.6B) and tts_model_size
# "1b7"; its code predictor keeps hidden 1024 (intermediate 3072, 5 layers, 16/8 heads of 128), so the
# official code adds small_to_mtp_projection (2048 -> 1024), and the speech tokenizer is the same one.
# Where the 1.7B values come from (no hub here): the talker_config of mlx-community's
# Qwen3-TTS-12Hz-1.7B-CustomVoice-bf16 config.json as mlx-audio-swift's config tests copy it (hidden 2048,
# intermediate 6144, 28 layers, 16/8 heads, head_dim 128, the same speakers, languages and codec ids as
# 0.6B), and a model reference for both CustomVoice sizes (code predictor 1024/3072/5 layers for 1.7B too).
# One port's notes say intermediate 8192; the copied config.json says 6144, which is what is used here.
REAL_TALKER = {"real-0.6b": (1024, 3072), "real-1.7b": (2048, 6144)}
REAL_LANGUAGES = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
    "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
    "beijing_dialect": 2074, "sichuan_dialect": 2062,
}
REAL_SPEAKERS = {
    "serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
    "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878,
}
DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>",
                  "<tts_text_eod>"]
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
CORPUS = [
    "assistant", "assistant\n", "user", "Hello world, this is a test of the voice gateway.",
    "The quick brown fox jumps over the lazy dog.", "How are you doing today? I am fine, thanks!",
    "Speech synthesis streams audio while the text is still arriving.",
    "今天天气很好，我们去公园散步吧。", "你好，世界！这是一个测试。", "我们一起吃饭吧。",
    "Numbers like 42 and 2026 are read digit by digit.",
]

PROMPTS = [
    # name, text, speaker, language, non_streaming_mode
    ("vivian_en_stream", "Hello world, this is a test.", "vivian", "english", False),
    ("ryan_zh_stream", "今天天气很好，我们去公园散步吧。", "ryan", "chinese", False),
    ("eric_zh_dialect_stream", "你好，世界！这是一个测试。", "eric", "chinese", False),
    ("dylan_auto_dialect_stream", "我们一起吃饭吧。", "dylan", "auto", False),
    ("ryan_auto_stream", "How are you doing today?", "ryan", "auto", False),
    ("vivian_en_nonstream", "The quick brown fox.", "vivian", "english", True),
]


# CustomVoice with instructions (1.7B; the official 0.6B drops them), VoiceDesign (the instruction describes
# the voice; empty: none), Base clones of REFERENCE_WAV (ICL: its codes and transcript in the prompt; x-vector:
# its speaker embedding only).
INSTRUCT_PROMPTS = [
    # name, text, speaker, language, non_streaming_mode, instruct
    ("vivian_en_instruct_stream", "Hello world, this is a test.", "vivian", "english", False,
     "Speak slowly, in a sad and tired voice."),
    ("ryan_zh_instruct_nonstream", "今天天气很好，我们去公园散步吧。", "ryan", "chinese", True, "用开心的语气说。"),
]
DESIGN_PROMPTS = [
    # name, text, language, non_streaming_mode, instruct
    ("design_en_stream", "Hello world, this is a test.", "english",
     False, "A warm, low female voice, speaking calmly."),
    ("design_zh_nonstream", "今天天气很好，我们去公园散步吧。", "chinese", True, "一个年轻男性的声音，语速很快。"),
    ("design_auto_stream", "How are you doing today?", "auto", False, "An old man with a raspy voice."),
    ("design_none_stream", "How are you doing today?", "english", False, ""),
]
CLONE_PROMPTS = [
    # name, text, mode, language, non_streaming_mode
    ("icl_en_stream", "Hello world, this is a test.", "icl", "english", False),
    ("icl_auto_nonstream", "How are you doing today?", "icl", "auto", True),
    # Longer than the reference's codes: the prompt holds as much text as the reference has frames, and the
    # rest is read one token per frame, as in the plain streaming prompt.
    ("icl_en_long_stream", "Numbers like 42 and 2026 are read digit by digit, while speech synthesis streams audio "
     "as the text is still arriving.", "icl", "english", False),
    ("x_vector_en_stream", "Hello world, this is a test.", "x_vector", "english", False),
    ("x_vector_zh_nonstream", "今天天气很好，我们去公园散步吧。", "x_vector", "chinese", True),
]
ROOT = Path(__file__).resolve().parent.parent
REFERENCE_WAV = ROOT / "tests" / "fixtures" / "one_sentence.wav"
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog."


def build_tokenizer(out: Path) -> dict[str, int]:
    """A small byte-level BPE in the Qwen2 layout; returns the ids of its special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    vocab = tok.get_vocab()
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    (out / "vocab.json").write_text(json.dumps(dict(ordered), ensure_ascii=False))
    tok.model.save(str(out), "tmp")
    (out / "tmp-merges.txt").rename(out / "merges.txt")
    (out / "tmp-vocab.json").unlink()
    specials = {name: len(vocab) + i for i, name in enumerate(SPECIAL_TOKENS)}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for name, i in specials.items()
        },
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }, indent=2))
    return specials


# --config: (geometry, tts_model_type, tts_model_size). The official code reads the kind from
# tts_model_type (custom_voice: nine named speakers; voice_design: a text description of the voice;
# base: a voice cloned from reference audio, with the speaker encoder) and ignores instructions when
# tts_model_size is "0b6".
CONFIGS = {
    "tiny": ("tiny", "custom_voice", "0b6"),
    "tiny-instruct": ("tiny", "custom_voice", "1b7"),
    "tiny-design": ("tiny", "voice_design", "1b7"),
    "tiny-base": ("tiny", "base", "0b6"),
    "real-0.6b": ("real-0.6b", "custom_voice", "0b6"),
    "real-1.7b": ("real-1.7b", "custom_voice", "1b7"),
    "real-0.6b-base": ("real-0.6b", "base", "0b6"),
    "real-1.7b-base": ("real-1.7b", "base", "1b7"),
    "real-1.7b-design": ("real-1.7b", "voice_design", "1b7"),
}


def model_config(name: str, specials: dict[str, int]) -> tuple[dict, dict]:
    """config.json and speech_tokenizer/config.json contents for one of CONFIGS.

    Base and VoiceDesign differ from CustomVoice only where their published config.json do
    (Qwen/Qwen3-TTS-12Hz-{0.6B,1.7B}-Base, -1.7B-VoiceDesign, as ports' config tests copy them): no named
    speakers (spk_id and spk_is_dialect empty), the ten languages without the two dialect tags, and, for
    Base, speaker_encoder_config {"enc_dim": talker hidden size, "sample_rate": 24000} (the other ECAPA-TDNN
    sizes are the official config class's defaults). All three share the speech tokenizer, whose published
    encoder_config (Mimi: 64 filters, ratios 8-6-5-4, 8 layers of 512, 32 quantizers of 2048 x 256) is the
    official MimiConfig's defaults, so the real sizes pass an empty encoder_config.
    """
    if name not in CONFIGS:
        raise SystemExit(f"unknown --config {name!r} ({', '.join(CONFIGS)})")
    geometry, model_type, size = CONFIGS[name]
    speaker_encoder: dict | None = None
    if geometry in REAL_TALKER:
        hidden, intermediate = REAL_TALKER[geometry]
        languages, speakers = dict(REAL_LANGUAGES), dict(REAL_SPEAKERS)
        talker = dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=28, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, vocab_size=3072, text_hidden_size=2048,
                      text_vocab_size=151936, rope_theta=1000000,
                      rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default",
                                    "type": "default"},
                      codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
                      codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157)
        predictor = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, vocab_size=2048, rope_theta=1000000)
        text_ids = dict(im_start_token_id=151644, im_end_token_id=151645, tts_pad_token_id=151671,
                        tts_bos_token_id=151672, tts_eos_token_id=151673)
        decoder = dict(codebook_size=2048, codebook_dim=512, hidden_size=512, latent_dim=1024,
                       intermediate_size=1024, num_attention_heads=16, num_key_value_heads=16, head_dim=64,
                       num_hidden_layers=8, decoder_dim=1536)
        encoder: dict = {}
        if model_type == "base":
            speaker_encoder = {"enc_dim": hidden, "sample_rate": 24000}
    else:
        # Codes 0..255 and control ids in [256, 1280): the official rule "ban [vocab-1024, vocab) but EOS"
        # then bans exactly the control ids, as it does at the real size. The code predictor is narrower
        # than the talker so that small_to_mtp_projection (a 1.7B feature) is exercised too.
        languages = {"english": 258, "chinese": 263, "german": 261, "sichuan_dialect": 270,
                     "beijing_dialect": 282}
        speakers = {"vivian": 1273, "ryan": 1269, "serena": 1274, "eric": 1083, "dylan": 1086}
        talker = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=1280, text_hidden_size=96,
                      text_vocab_size=max(specials.values()) + 1, rope_theta=1000000,
                      rope_scaling={"interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default",
                                    "type": "default"},
                      codec_pad_id=356, codec_bos_id=357, codec_eos_token_id=358, codec_think_id=362,
                      codec_nothink_id=363, codec_think_bos_id=364, codec_think_eos_id=365)
        predictor = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, vocab_size=256, rope_theta=1000000)
        text_ids = dict(im_start_token_id=specials["<|im_start|>"], im_end_token_id=specials["<|im_end|>"],
                        tts_pad_token_id=specials["<tts_pad>"], tts_bos_token_id=specials["<tts_text_bos>"],
                        tts_eos_token_id=specials["<tts_text_eod>"])
        decoder = dict(codebook_size=256, codebook_dim=32, hidden_size=32, latent_dim=48, intermediate_size=64,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=8, num_hidden_layers=2,
                       decoder_dim=64)
        encoder = dict(hidden_size=16, num_filters=4, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=2, head_dim=8, intermediate_size=32, codebook_size=64,
                       codebook_dim=16, vector_quantization_hidden_dimension=16, num_quantizers=16,
                       upsample_groups=16)
        if model_type == "base":
            # The encoder the engine runs for cloning: a quantizer projection (vq width 8 != 16), more
            # quantizers than the 16 valid ones, two layers with a sliding window shorter than the
            # reference (the official default attention ignores the window: this pins that).
            encoder.update(num_hidden_layers=2, codebook_dim=8, vector_quantization_hidden_dimension=8,
                           num_quantizers=20, sliding_window=8)
            speaker_encoder = dict(mel_dim=128, enc_dim=talker["hidden_size"], enc_channels=[16, 16, 16, 16, 48],
                                   enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
                                   enc_attention_channels=8, enc_res2net_scale=4, enc_se_channels=8,
                                   sample_rate=24000)
    if model_type != "custom_voice":
        languages = {k: v for k, v in languages.items() if "dialect" not in k}
        speakers = {}
    talker.update(codec_language_id=languages, spk_id=speakers,
                  spk_is_dialect={s: DIALECTS.get(s, False) for s in speakers})
    talker.update(num_code_groups=16, hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=32768,
                  position_id_per_seconds=13,
                  code_predictor_config=dict(predictor, num_code_groups=16, hidden_act="silu", rms_norm_eps=1e-6,
                                             max_position_embeddings=65536))
    config = dict(talker_config=talker, tokenizer_type="qwen3_tts_tokenizer_12hz", tts_model_size=size,
                  tts_model_type=model_type, assistant_token_id=None, **text_ids)
    if speaker_encoder is not None:
        config["speaker_encoder_config"] = speaker_encoder
    decoder.update(max_position_embeddings=8000, rope_theta=10000, sliding_window=72, hidden_act="silu",
                   layer_scale_initial_scale=0.01, rms_norm_eps=1e-5, num_quantizers=16,
                   num_semantic_quantizers=1, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
                   attention_bias=False, attention_dropout=0.0, vector_quantization_hidden_dimension=512)
    speech = dict(encoder_config=dict(encoder, _frame_rate=12.5), decoder_config=decoder,
                  encoder_valid_num_quantizers=16, input_sample_rate=24000, output_sample_rate=24000,
                  decode_upsample_rate=1920, encode_downsample_rate=1920)
    return config, speech


@torch.no_grad()
def randomize(module: torch.nn.Module, seed: int) -> None:
    """Seeded weights with unit-scale activations: HF's 0.02-std init leaves logits nearly tied, which
    would make greedy parity a coin toss."""
    gen = torch.Generator().manual_seed(seed)
    for name, tensor in sorted(module.state_dict().items()):
        if not tensor.is_floating_point():
            continue
        noise = torch.randn(tensor.shape, generator=gen)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "cluster_usage":
            value = 0.5 + torch.rand(tensor.shape, generator=gen)
        elif leaf in ("alpha", "beta", "gamma", "scale"):
            value = 0.1 * noise
        elif tensor.dim() == 1 and "norm" in name and leaf == "weight":
            value = 1.0 + 0.1 * noise
        elif tensor.dim() == 1:
            value = 0.02 * noise
        elif "embedding" in name:
            value = noise
        else:
            value = noise / math.sqrt(tensor[0].numel())
        tensor.copy_(value.to(tensor.dtype))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny", help="tiny (committed fixture), real-0.6b or real-1.7b")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--frames", type=int, default=24, help="max_new_tokens of each greedy reference")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--cpu-drift", action="store_true",
                        help="only re-decode the recorded decoder_codes of --out with the official code on the CPU "
                             "and print how far that lands from the recorded (e.g. GPU) waveform")
    args = parser.parse_args()
    if args.cpu_drift:
        cpu_drift(args.out)
        return

    _stub_unused_audio_modules()
    # References in float32 without TF32 (cuDNN convolutions default to it), so 1e-4 comparisons hold.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    from qwen_tts import Qwen3TTSModel
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
    from safetensors.torch import save_file

    out: Path = args.out
    (out / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    specials = build_tokenizer(out)
    config, speech = model_config(args.config, specials)
    model_type, size = config["tts_model_type"], config["tts_model_size"]

    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**config))
    randomize(model, args.seed)
    model.save_pretrained(out, safe_serialization=True)
    # save_pretrained serialises every PretrainedConfig default (speaker_encoder_config with a model_type
    # that its own __init__ then rejects); the published config.json is the plain dict.
    (out / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts", **config}, indent=2))
    (out / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
        "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0, "subtalker_top_k": 50,
        "max_new_tokens": 8192,
    }, indent=2))
    codec = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**speech))
    randomize(codec, args.seed + 1)
    # The decoder as the codec reference conditions it: unit gain per block and a waveform inside the
    # [-1, 1] clamp, so a comparison of waveforms compares every sample (a clipped one compares nothing)
    # and float drift stays at the level of one layer's rounding, whatever CPU wrote the reference.
    randomize_decoder(codec.decoder, args.seed + 1)
    codec.save_pretrained(out / "speech_tokenizer", safe_serialization=True)
    (out / "speech_tokenizer" / "preprocessor_config.json").write_text(json.dumps({
        "chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
        "overlap": None, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
        "sampling_rate": 24000,
    }, indent=2))
    del model, codec

    # The oracle itself: the checkpoint read back through the official loader, as a user would.
    dtype = getattr(torch, args.dtype)
    tts = Qwen3TTSModel.from_pretrained(str(out), dtype=dtype, device_map=args.device)
    refs: dict = {"config": args.config, "seed": args.seed, "max_new_tokens": args.frames,
                  "repetition_penalty": 1.05, "prompts": []}
    tensors: dict[str, torch.Tensor] = {}
    gen = tts._merge_generate_kwargs(do_sample=False, subtalker_dosample=False, max_new_tokens=args.frames)
    timings = []

    def record(name: str, text: str, language: str, non_streaming: bool, **conditioning) -> list:
        """The official greedy codes of one prompt, as the public generate_* methods build it."""
        input_ids = tts._tokenize_texts([tts._build_assistant_text(text)])
        entry = {"name": name, "text": text}
        kwargs: dict = {}
        if "speaker" in conditioning:
            entry["speaker"] = conditioning["speaker"]
            kwargs["speakers"] = [conditioning["speaker"]]
        instruct = conditioning.get("instruct")
        if "instruct" in conditioning:
            entry["instruct"] = instruct
            ids = tts._tokenize_texts([tts._build_instruct_text(instruct)])[0] if instruct else None
            entry["instruct_ids"] = [] if ids is None else ids[0].tolist()
            kwargs["instruct_ids"] = [ids]
        elif model_type != "base":
            kwargs["instruct_ids"] = [None]
        if "clone" in conditioning:
            item = conditioning["clone"]
            entry["clone"] = conditioning["clone_name"]
            kwargs["voice_clone_prompt"] = tts._prompt_items_to_voice_clone_prompt([item])
            if item.icl_mode:
                ref_ids = tts._tokenize_texts([tts._build_ref_text(item.ref_text)])[0]
                entry["ref_ids"] = ref_ids[0].tolist()
                kwargs["ref_ids"] = [ref_ids]
        start = time.perf_counter()
        codes, _ = tts.model.generate(input_ids=input_ids, languages=[language], non_streaming_mode=non_streaming,
                                      **kwargs, **gen)
        timings.append(time.perf_counter() - start)
        entry.update(language=language, non_streaming_mode=non_streaming, input_ids=input_ids[0][0].tolist(),
                     codes=codes[0].tolist())
        refs["prompts"].append(entry)
        return codes[0]

    if model_type == "custom_voice":
        for name, text, speaker, language, non_streaming in PROMPTS:
            record(name, text, language, non_streaming, speaker=speaker)
        if size != "0b6":  # the 0.6B CustomVoice ignores instructions
            for name, text, speaker, language, non_streaming, instruct in INSTRUCT_PROMPTS:
                record(name, text, language, non_streaming, speaker=speaker, instruct=instruct)
    elif model_type == "voice_design":
        for name, text, language, non_streaming, instruct in DESIGN_PROMPTS:
            record(name, text, language, non_streaming, instruct=instruct)
    else:
        record_clones(tts, out, refs, tensors, record, gen)
    if model_type == "custom_voice":
        first = torch.tensor(refs["prompts"][0]["codes"], device=args.device)
        wavs, rate = tts.model.speech_tokenizer.decode([{"audio_codes": first}])
        tensors[f"greedy_wav.{refs['prompts'][0]['name']}"] = torch.from_numpy(wavs[0]).float()
    if args.config == "tiny" or args.config.startswith("real"):
        # The codec decoder on its own, for given codes (2 chunks' worth of left context and more).
        rng = torch.Generator().manual_seed(args.seed + 2)
        frames = 40
        codebook = speech["decoder_config"]["codebook_size"]
        decoder_codes = torch.randint(0, codebook, (frames, 16), generator=rng)
        wavs, rate = tts.model.speech_tokenizer.decode([{"audio_codes": decoder_codes.to(args.device)}])
        tensors["decoder_codes"] = decoder_codes.T.contiguous()  # [16, T], as CodecDecoder.decode takes it
        tensors["decoder_wav"] = torch.from_numpy(wavs[0]).float()
    refs["sample_rate"] = tts.model.speech_tokenizer.get_output_sample_rate()
    refs["official_generate_seconds"] = timings
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(out / "references.safetensors"))
    (out / "references.json").write_text(json.dumps(refs, ensure_ascii=False, indent=1))
    (out / "README.md").write_text(README.format(config=args.config, seed=args.seed, frames=args.frames)
                                   + KIND_NOTES[model_type].format())
    print(f"wrote {out} ({args.config}); official generate seconds: {[round(t, 3) for t in timings]}")


def read_wav(path: Path) -> tuple:
    import soundfile

    audio, rate = soundfile.read(str(path), dtype="float32", always_2d=False)
    return audio, rate


def record_clones(tts, out: Path, refs: dict, tensors: dict, record, gen: dict) -> None:
    """Base: the official speaker embedding and encoder codes of the reference recording (once as recorded,
    at 24 kHz, and once at 16 kHz, which the official code resamples), and greedy codes of clones from it."""
    import librosa
    import numpy as np
    import soundfile

    audio, rate = read_wav(REFERENCE_WAV)
    # The 16 kHz copy is stored (pcm16): the engine's tests read the very samples the official code read.
    low = librosa.resample(audio, orig_sr=rate, target_sr=16000)
    soundfile.write(str(out / "reference_16k.wav"), low, 16000, subtype="PCM_16")
    low, low_rate = read_wav(out / "reference_16k.wav")
    refs["references"] = {
        "ref_24k": {"path": str(REFERENCE_WAV.relative_to(ROOT)), "text": REFERENCE_TEXT, "sample_rate": rate},
        "ref_16k": {"path": "reference_16k.wav", "text": REFERENCE_TEXT, "sample_rate": low_rate},
    }
    items = {}
    for key, (wav, sr) in {"ref_24k": (audio, rate), "ref_16k": (low, low_rate)}.items():
        icl, = tts.create_voice_clone_prompt(ref_audio=(np.asarray(wav), sr), ref_text=REFERENCE_TEXT)
        xvec, = tts.create_voice_clone_prompt(ref_audio=(np.asarray(wav), sr), x_vector_only_mode=True)
        assert torch.equal(icl.ref_spk_embedding, xvec.ref_spk_embedding)
        tensors[f"speaker_embedding.{key}"] = icl.ref_spk_embedding.float()
        tensors[f"ref_codes.{key}"] = icl.ref_code.long()
        items[key] = {"icl": icl, "x_vector": xvec}
    for name, text, mode, language, non_streaming in CLONE_PROMPTS:
        item = items["ref_24k"][mode]
        codes = record(name, text, language, non_streaming, clone=item, clone_name=f"ref_24k.{mode}")
        if mode == "icl" and not non_streaming:
            # The official waveform of a clone: the reference codes and the new ones decoded together, the
            # reference's share cut off (generate_voice_clone).
            wavs, _ = tts.generate_voice_clone(text=text, language=language, voice_clone_prompt=[item],
                                               non_streaming_mode=False, **gen)
            assert len(wavs[0]) == len(codes) * 1920, (len(wavs[0]), len(codes))
            tensors[f"greedy_wav.{name}"] = torch.from_numpy(wavs[0]).float()


def cpu_drift(out: Path) -> None:
    """The official decoder's own device-to-device float drift: the yardstick for comparing a GPU waveform."""
    _stub_unused_audio_modules()
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer
    from safetensors.torch import load_file

    refs = load_file(str(out / "references.safetensors"))
    codec = Qwen3TTSTokenizer.from_pretrained(str(out / "speech_tokenizer"), dtype=torch.float32, device_map="cpu")
    wavs, _ = codec.decode([{"audio_codes": refs["decoder_codes"].T}])
    wav, ref = torch.from_numpy(wavs[0]), refs["decoder_wav"]
    error = float((wav - ref).norm() / ref.norm())
    print(f"official decode on the CPU vs the recorded waveform: relative error {error:.3g}")


README = """# Qwen3-TTS 12Hz parity fixture ({config}, seed {seed})

Written by `python -m scripts.make_parity_fixture --config {config}` through the official qwen-tts 0.1.1 code;
random weights, so the audio is noise: it pins numbers, not quality.

- config.json, generation_config.json, model.safetensors: the talker checkpoint (official parameter names).
- vocab.json, merges.txt, tokenizer_config.json: a small byte-level BPE in the Qwen2 layout.
- speech_tokenizer/: the 12Hz codec (config.json, preprocessor_config.json, model.safetensors; a tiny Mimi
  encoder is included because the official class builds one, the engine skips it).
- references.json: per prompt (text, speaker, language, non_streaming_mode) the official input_ids and the
  greedy codes [frames][16] of `Qwen3TTSForConditionalGeneration.generate(do_sample=False,
  subtalker_dosample=False, repetition_penalty=1.05, max_new_tokens={frames})` (so {frames} - 1 frames when no
  EOS comes first).
- references.safetensors:
  - `decoder_codes` [16, 40] int64 random codes and `decoder_wav` [40*1920] float32: the official
    `speech_tokenizer.decode` (chunked_decode) of those codes; the codec decoder's reference.
  - `greedy_wav.vivian_en_stream` [frames*1920]: the official waveform of the first prompt's greedy codes.
"""

KIND_NOTES = {
    "custom_voice": "",
    "voice_design": """
VoiceDesign (tts_model_type voice_design): each prompt's `instruct` describes the voice; `instruct_ids` are the
official tokens of "<|im_start|>user\\n{{instruct}}<|im_end|>\\n" (empty: no instruction), as
`generate_voice_design` passes them. No decoder references here (the codec is the CustomVoice fixture's code).
""",
    "base": """
Base (tts_model_type base, with `speaker_encoder.*` and a Mimi encoder the engine runs): `references` name the
reference recordings (tests/fixtures/one_sentence.wav at 24 kHz, and reference_16k.wav here, a 16 kHz pcm16 copy
the official code resamples). references.safetensors holds, per recording, `speaker_embedding.<ref>` (the
official `extract_speaker_embedding`) and `ref_codes.<ref>` [frames, 16] (the official speech tokenizer's
`encode`), both from `create_voice_clone_prompt`; and `greedy_wav.<prompt>` for the streaming ICL prompt (the
official `generate_voice_clone` waveform: reference and new codes decoded together, the reference cut off).
Each prompt's `clone` is `<ref>.icl` (reference codes and transcript in the prompt; `ref_ids` are the official
tokens of the transcript's "<|im_start|>assistant\\n{{text}}<|im_end|>\\n") or `<ref>.x_vector` (the speaker
embedding only).
""",
}


if __name__ == "__main__":
    main()
