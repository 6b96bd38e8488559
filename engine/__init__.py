"""In-process Qwen3-TTS 12Hz engine, plain PyTorch with a few fused Triton kernels on a GPU.

layers.py (Qwen3 blocks, static KV cache) -> talker.py (talker, code predictor, the batched prefill and
frame step) -> prompt.py (CustomVoice prompts, text tokens) -> stream.py (one utterance's text and packets)
-> runner.py (continuous batching over all running streams, CUDA graphs per batch size, engine metrics) ->
worker.py (the thread that owns the device; QwenTTSEngine, the gateway's TTSEngine).
kernels.py holds the fused GPU kernels beside the PyTorch code they replace; checkpoint.py loads a Hugging
Face checkpoint strictly; codec.py decodes codes to audio.
"""
