"""The engine's options: the ``[engine]`` section of the gateway's config.toml, where each is documented.

The engine reads them from this dataclass in a thread of the caller's process (engine.threaded), and from
its JSON form on an engine process's command line (engine.process, started by engine.supervisor). A field's
bounds are its metadata (at_least, at_most, above, off, choices), which the gateway's configuration checks
(gateway.config.validate).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineConfig:
    checkpoint: str = ""
    device: str = "auto"
    dtype: str = field(default="auto", metadata={"choices": ("auto", "float32", "bfloat16", "float16")})
    packet_frames: int = field(default=4, metadata={"at_least": 1})
    # Frames in a stream's first packet (0 = packet_frames): 1 starts audio after a single frame.
    first_packet_frames: int = field(default=1, metadata={"at_least": 0})
    max_frames: int = field(default=1500, metadata={"at_least": 1})
    max_text_chars: int = field(default=2000, metadata={"at_least": 1})
    seed: int = field(default=0, metadata={"at_least": 0, "at_most": 2**32 - 1})
    greedy: bool = False
    # Streams the engine runs at once (each holds a preallocated KV-cache slot); more wait for a slot.
    # 0 = on a GPU as many as 60% of its free memory holds at start-up (at most 1024), 4 on a CPU
    # (engine.batcher.auto_streams).
    max_streams: int = field(default=0, metadata={"at_least": 0})
    # CUDA graphs of the engine's step, one per batch size up to graph_max_batch (0 = max_streams).
    cuda_graphs: bool = True
    graph_max_batch: int = field(default=0, metadata={"at_least": 0})
    # engine.kernels' Triton kernels on a GPU (false: the PyTorch ops, ~2.5x slower per frame).
    fused_kernels: bool = True
    # "thread": the engine runs in a worker thread of the gateway's process; "process": in engine processes
    # (one per device, engine.process) that every gateway process shares over IPC (gateway.responders.engine_client);
    # "auto": "process" on a host with GPUs, or when several workers share the engine, else "thread".
    mode: str = field(default="auto", metadata={"choices": ("auto", "thread", "process")})
    # process mode: the devices, one engine process each ("cuda:0,cuda:1"; "auto": every GPU, else `device`).
    devices: str = "auto"
    # process mode: the folder of the IPC sockets ("" = a private temporary folder).
    ipc_dir: str = ""
    # process mode: connect to engine processes started elsewhere, at these endpoints ("" = start them here).
    endpoints: str = ""
    heartbeat_ms: float = field(default=500.0, metadata={"above": 0})
    start_timeout_s: float = field(default=900.0, metadata={"above": 0})
    # Cloned voices (a Base checkpoint): the longest reference recording, whose frames every row's KV cache
    # holds room for (30 s: 376 positions more per row).
    max_reference_s: float = field(default=30.0, metadata={"at_least": 1, "at_most": 120})
    # Instructions and voice descriptions (CustomVoice 1.7B, VoiceDesign): the most tokens, likewise held.
    max_instructions_tokens: int = field(default=256, metadata={"at_least": 1})
    voices: dict[str, str] = field(default_factory=dict)
    # process mode: the Smart Turn end-of-turn model's ONNX file (engine.turn_model), run batched on this
    # engine's device for every gateway process ("" = none). Set by the gateway ([semantic_vad] device).
    turn_model: str = ""
    # process mode: Silero VAD's TorchScript file (engine.vad_model), whose windows of every gateway process run
    # batched on this engine's device, served on engine.ipc.vad_endpoint ("" = none). Set by the gateway ([vad]
    # device).
    vad_model: str = ""

    @classmethod
    def from_dict(cls, options: dict[str, Any]) -> EngineConfig:
        """The options as ``dataclasses.asdict`` gave them (an engine process's --config)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in names})
