"""The Qwen3-TTS 12Hz engine, plain PyTorch with a few fused Triton kernels on a GPU. It imports nothing of
the gateway: api.py is its interface (chunks, errors, the stream protocol), config.py its options.

layers.py (Qwen3 blocks, static KV cache) -> talker.py (talker, code predictor, the batched prefill and
frame step) -> prompt.py (the prompts of the three kinds of checkpoint: CustomVoice speakers and
instructions, VoiceDesign descriptions, Base clones; text tokens) -> stream.py (one utterance's text and
packets) -> runner.py (continuous batching over all running streams, CUDA graphs per batch size, engine
metrics) -> batcher.py (the batching loop over one or more checkpoints) -> threaded.py (QwenTTSEngine: the
loop in a thread of the caller's process). voices.py holds a prepared voice (VoicePrompt), clone.py makes
one with speaker.py (the Base speaker encoder) and encoder.py (the speech tokenizer's encoder).
process.py runs the same loop as an engine process that owns one device and serves every gateway process
over ZeroMQ (ipc.py: the messages; handles.py: a stream's text input and output queue on either side;
supervisor.py: one engine process per device, restarted on death).
kernels.py holds the fused GPU kernels beside the PyTorch code they replace; checkpoint.py loads a Hugging
Face checkpoint strictly; codec.py decodes codes to audio. Cloning a voice (clone.py) runs a Base
checkpoint's speaker encoder (speaker.py) and the speech tokenizer's encoder (encoder.py) once per voice;
voices.py holds the result, a VoicePrompt, which needs no torch and travels as bytes.
"""
