"""The one configuration: config.toml, then environment variables on top.

Every option lives in a dataclass below and is documented in config.toml, the defaults the package
ships (``voice-gateway config`` prints it: the start of a configuration of your own).
An environment variable ``GATEWAY_<SECTION>_<KEY>`` (upper case) overrides ``[section] key``;
API keys are never read from the file, only from the variables the file names.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from engine.config import EngineConfig
from gateway.shipped import DEFAULT_CONFIG


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the option."""


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    web_dir: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    allowed_origins: str = ""
    allowed_hosts: str = ""
    max_message_bytes: int = 22 * 1024 * 1024
    inbound_free_bytes: int = 256 * 1024
    inbound_budget_bytes: int = 256 * 1024 * 1024
    send_timeout_s: float = 10.0
    request_head_timeout_s: float = 10.0
    request_body_timeout_s: float = 30.0
    request_idle_timeout_s: float = 5.0
    max_request_headers: int = 100
    max_header_line_bytes: int = 8190
    max_connections_per_client: int = 32
    forwarded_allow_ips: str = ""
    max_sessions: int = 1000
    drain_seconds: float = 600.0
    drain_notice_seconds: float = 30.0
    workers: int = 0
    worker_balance: str = "connections"
    backend_check_s: float = 15.0
    ready_requires_backends: bool = False


@dataclass
class SessionConfig:
    model: str = "gpt-realtime"
    voice: str = "alloy"
    instructions: str = "You are a helpful voice assistant. Answer briefly."
    max_append_bytes: int = 15 * 1024 * 1024
    max_buffer_seconds: float = 900.0
    idle_buffer_seconds: float = 60.0
    max_items: int = 1000
    max_audio_seconds: float = 900.0
    max_text_bytes: int = 2 * 1024 * 1024
    max_out_of_band_responses: int = 4


@dataclass
class VadConfig:
    enabled: bool = True
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int = 0
    min_speech_ms: int = 64
    inline_windows: int = 4
    batch_interval_ms: float = 10.0


@dataclass
class SemanticVadConfig:
    model_path: str = ""
    # smart-turn-v3.2-cpu.onnx in pipecat-ai==1.14.0 (gateway.runtime.smart_turn.MODEL_SHA256)
    model_sha256: str = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
    pause_ms: int = 200
    recheck_ms: int = 0
    low_threshold: float = 0.7
    medium_threshold: float = 0.5
    high_threshold: float = 0.3
    low_max_wait_ms: int = 8000
    medium_max_wait_ms: int = 4000
    high_max_wait_ms: int = 2000
    max_batch: int = 1


@dataclass
class ResponderConfig:
    kind: str = "auto"
    echo_pace: float = 1.0
    echo_chunk_ms: int = 40


@dataclass
class SttConfig:
    base_url: str = ""
    model: str = "whisper-1"
    api_key_env: str = "STT_API_KEY"
    language: str = ""
    timeout_s: float = 10.0
    stream: bool = False
    audio_in: bool = False
    early_ms: int = 200


@dataclass
class LlmConfig:
    base_url: str = ""
    model: str = "gpt-4o-mini"
    api_key_env: str = "LLM_API_KEY"
    temperature: float = 0.7
    max_output_tokens: int = 512
    timeout_s: float = 30.0


@dataclass
class McpConfig:
    enabled: bool = True
    allowed_hosts: str = ""
    max_servers: int = 8
    list_timeout_s: float = 10.0
    call_timeout_s: float = 30.0
    max_response_bytes: int = 1024 * 1024
    max_output_chars: int = 20_000
    max_tools: int = 100
    max_rounds: int = 4


@dataclass
class TtsConfig:
    engine: str = "auto"
    starter_chars: int = 24
    max_segment_chars: int = 160
    language: str = "auto"


@dataclass
class LocalConfig:
    stt: bool = True
    stt_model: str = ""
    llm_model: str = ""
    cache_dir: str = ""
    max_output_tokens: int = 60
    context_tokens: int = 512
    cached_sessions: int = 8
    starter_chars: int = 12
    temperature: float = 0.0
    system_prompt: str = "You are a helpful voice assistant. Answer in one short sentence."
    examples: dict[str, str] = field(default_factory=lambda: {
        "How many wheels does a bicycle have?": "A bicycle has two wheels.",
        "What is the capital of Italy?": "The capital of Italy is Rome.",
        "What color is snow?": "Snow is white.",
    })
    stt_threads: int = 2
    llm_threads: int = 1
    tts_threads: int = 1


@dataclass
class WebRtcConfig:
    enabled: bool = True
    max_pending_calls: int = 16
    max_pending_calls_per_client: int = 4
    connect_timeout_s: float = 15.0
    ice_servers: str = ""
    turn_username: str = ""
    turn_credential_env: str = "TURN_CREDENTIAL"
    jitter_prefetch: int = 0
    advertised_host: str = ""
    advertised_url: str = ""


@dataclass
class LiveConfig:
    """[live]: GPT-Live sessions (/v1/live/sessions). Its voice model is the gateway's own conversational path (the
    [responder]), its delegated backend any OpenAI-compatible server."""

    models: str = "gpt-live-1,gpt-live-1.1"  # the model names served (a prefix such as openai/ is accepted)
    instructions: str = ""  # the voice model's instructions when a session sends none ("" = [session] instructions)
    voice: str = ""  # the voice that speaks an unmapped built-in name ("" = [session] voice)
    voices: dict[str, str] = field(default_factory=dict)  # built-in voice name -> TTS voice
    eagerness: str = "high"  # how readily a pause ends the user's turn ([semantic_vad]'s levels)
    max_session_s: float = 3600.0  # a session's life: its expires_at, then it closes "expired"
    no_audio_timeout_s: float = 30.0  # a session without input audio this long closes "expired"
    max_append_tokens: int = 500  # one append's content, in tokens (estimated: gateway.live.settings.tokens)
    max_pending_appends: int = 32  # appends waiting for their place on the timeline
    max_instructions_tokens: int = 16384
    max_input_tokens: int = 8192  # startup input history
    max_delegations: int = 64  # delegations a session keeps (the oldest client one is forgotten beyond it)
    max_response_runs: int = 4  # Responses delegation runs at once
    max_response_items: int = 64  # response.item.create items waiting for response.create
    max_lead_ms: int = 3000  # input that may run ahead of the output's real-time pace before a client waits
    usage_interval_s: float = 15.0  # session.usage.updated every this much of the timeline
    delegation_base_url: str = ""  # the Responses delegation's server ("" = [llm] base_url)
    delegation_api_key_env: str = "DELEGATION_API_KEY"  # its key's variable ("" or unset: [llm] api_key_env's)
    delegation_api: str = "auto"  # "responses", "chat" (completions), or "auto": Responses where the server has it
    delegation_model: str = ""  # the backend model to call whatever a session names ("" = the session's)
    delegation_timeout_s: float = 120.0


@dataclass
class TraceConfig:
    jsonl_path: str = ""


@dataclass
class VoiceConfig:
    """One [voices.NAME] table: a voice the engine prepares at start, which sessions name as NAME (or
    {"id": NAME}). A clone of a reference recording (`reference`, with its `transcript` for in-context
    cloning) needs a Base checkpoint; a design (`description`) a VoiceDesign one."""

    reference: str = ""  # a WAV file; a relative path is read from the config file's folder
    transcript: str = ""
    description: str = ""


@dataclass
class SpeechConfig:
    max_input_chars: int = 4096
    max_instructions_chars: int = 4096
    max_streams: int = 0
    max_waiting: int = 64
    wait_timeout_s: float = 10.0
    retry_after_s: int = 1


@dataclass
class VoicesConfig:
    """[voices]: the store of custom voices (its options), and the voices the engine prepares at start, one
    [voices.NAME] table each (`named`, lower-case names; the file only: no environment variable names one)."""

    dir: str = ""
    max_voices: int = 20
    max_consents: int = 100
    max_file_bytes: int = 10 * 1024 * 1024
    max_sample_seconds: float = 30.0
    max_consent_seconds: float = 30.0
    max_name_chars: int = 256
    max_prompt_chars: int = 2000
    phrase_match: float = 0.8
    similarity_threshold: float = 0.5
    named: dict[str, VoiceConfig] = field(default_factory=dict)


@dataclass
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    vad: VadConfig = field(default_factory=VadConfig)
    semantic_vad: SemanticVadConfig = field(default_factory=SemanticVadConfig)
    responder: ResponderConfig = field(default_factory=ResponderConfig)
    stt: SttConfig = field(default_factory=SttConfig)
    llm: LlmConfig = field(default_factory=LlmConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    tts: TtsConfig = field(default_factory=TtsConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    webrtc: WebRtcConfig = field(default_factory=WebRtcConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    live: LiveConfig = field(default_factory=LiveConfig)
    speech: SpeechConfig = field(default_factory=SpeechConfig)
    voices: VoicesConfig = field(default_factory=VoicesConfig)


def _coerce(value: Any, kind: Any, name: str) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif kind is str:
        if isinstance(value, str):
            return value
    elif getattr(kind, "__origin__", None) is dict:
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return dict(value)
        if isinstance(value, str):
            # "alloy=vivian,echo=ryan" in an environment variable
            try:
                return dict(pair.split("=", 1) for pair in value.split(",") if pair)
            except ValueError:
                pass
    raise ConfigError(f"option {name}: expected {getattr(kind, '__name__', kind)}, got {value!r}")


# Environment variables of the libraries that the gateway does not read: naming one is an error saying which
# option does it (silently ignored, it would leave a proxy untrusted or trusted unawares).
FOREIGN_ENV = {
    "FORWARDED_ALLOW_IPS": "uvicorn's variable is not read: set [server] forwarded_allow_ips "
                           "(GATEWAY_SERVER_FORWARDED_ALLOW_IPS) to the proxies whose X-Forwarded-For to believe",
}


def _apply(section: Any, values: dict[str, Any], prefix: str) -> None:
    hints = get_type_hints(type(section))
    for key, value in values.items():
        if key not in hints or (prefix == "voices" and key == "named"):  # named voices are [voices.NAME] tables
            raise ConfigError(f"unknown option {prefix}.{key}")
        setattr(section, key, _coerce(value, hints[key], f"{prefix}.{key}"))


def load_config(path: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None) -> Config:
    """Read ``path`` (default: the package's config.toml), then apply GATEWAY_* overrides."""
    env = os.environ if env is None else env
    config = Config()
    file = Path(path) if path is not None else DEFAULT_CONFIG
    if path is not None or file.exists():
        try:
            data = tomllib.loads(file.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {file}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {file}: {getattr(exc, 'strerror', None) or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file} is not valid TOML: {exc}") from None
        for name, values in data.items():
            if not hasattr(config, name) or not isinstance(values, dict):
                raise ConfigError(f"unknown config section [{name}] in {file}")
            if name == "voices":  # its options, and a table per named voice
                config.voices.named = _voices({k: v for k, v in values.items() if isinstance(v, dict)}, file.parent)
                values = {k: v for k, v in values.items() if not isinstance(v, dict)}
            _apply(getattr(config, name), values, name)
    for name, why in FOREIGN_ENV.items():
        if name in env:
            raise ConfigError(f"environment variable {name}: {why}")
    for f in dataclasses.fields(config):
        section = getattr(config, f.name)
        prefix = f"GATEWAY_{f.name.upper()}_"
        overrides = {
            k[len(prefix) :].lower(): v for k, v in env.items() if k.startswith(prefix)
        }
        _apply(section, overrides, f.name)
    return config


def check(config: Config) -> None:
    """Every option's value and how options go together, a ConfigError naming the first that is wrong. What a
    value needs of the machine (a file, a port, an installed extra, a model) is checked where it is used."""
    server, local, semantic, engine = config.server, config.local, config.semantic_vad, config.engine
    if not 0 <= server.port <= 65535:
        raise ConfigError(f"option server.port: must be between 0 and 65535, got {server.port}")
    for name in ("drain_seconds", "drain_notice_seconds", "workers", "backend_check_s"):
        _at_least(f"server.{name}", getattr(server, name), 0)
    for name in ("send_timeout_s", "request_head_timeout_s", "request_body_timeout_s", "request_idle_timeout_s"):
        if getattr(server, name) <= 0:
            raise ConfigError(f"option server.{name}: must be > 0, got {getattr(server, name)}")
    _at_least("server.max_connections_per_client", server.max_connections_per_client, 1)
    # The websockets library, which parses a WebSocket handshake, takes at most 128 headers and 8 KiB lines.
    if not 1 <= server.max_request_headers <= 128:
        raise ConfigError(f"option server.max_request_headers: must be between 1 and 128, got "
                          f"{server.max_request_headers}")
    if not 256 <= server.max_header_line_bytes <= 8190:
        raise ConfigError(f"option server.max_header_line_bytes: must be between 256 and 8190, got "
                          f"{server.max_header_line_bytes}")
    _check_proxies(server.forwarded_allow_ips)
    for name in ("max_output_tokens", "context_tokens", "starter_chars", "stt_threads", "llm_threads", "tts_threads"):
        _at_least(f"local.{name}", getattr(local, name), 1)
    _at_least("local.cached_sessions", local.cached_sessions, 0)
    _one_of("server.worker_balance", server.worker_balance, ("connections", "accept"))
    for name in ("max_pending_calls", "max_pending_calls_per_client"):
        _at_least(f"webrtc.{name}", getattr(config.webrtc, name), 1)
    if not 0.0 <= local.temperature <= 2.0:
        raise ConfigError(f"option local.temperature: must be between 0 and 2, got {local.temperature}")
    _at_least("session.max_out_of_band_responses", config.session.max_out_of_band_responses, 1)
    live = config.live
    for name in ("max_session_s", "no_audio_timeout_s", "usage_interval_s", "delegation_timeout_s"):
        if getattr(live, name) <= 0:
            raise ConfigError(f"option live.{name}: must be > 0, got {getattr(live, name)}")
    for name in ("max_append_tokens", "max_pending_appends", "max_instructions_tokens", "max_input_tokens",
                 "max_delegations", "max_response_runs", "max_response_items", "max_lead_ms"):
        _at_least(f"live.{name}", getattr(live, name), 1)
    if not any(m.strip() for m in live.models.split(",")):
        raise ConfigError("option live.models: name at least one model")
    _one_of("live.delegation_api", live.delegation_api, ("auto", "responses", "chat"))
    _one_of("live.eagerness", live.eagerness, ("low", "medium", "high", "auto"))
    _one_of("responder.kind", config.responder.kind, ("auto", "echo", "pipeline", "local"))
    _one_of("tts.engine", config.tts.engine, ("auto", "tone", "piper", "qwen3"))
    _one_of("engine.mode", engine.mode, ("auto", "thread", "process"))
    for name in ("heartbeat_ms", "start_timeout_s"):
        if getattr(engine, name) <= 0:
            raise ConfigError(f"option engine.{name}: must be > 0, got {getattr(engine, name)}")
    if config.responder.kind == "pipeline" and not config.llm.base_url:
        raise ConfigError('option responder.kind = "pipeline" needs [llm] base_url')
    if config.responder.kind == "local" and config.stt.audio_in:
        raise ConfigError('option stt.audio_in needs an LLM that hears audio; responder.kind = "local" reads text')
    # [tts] engine "auto" is qwen3 when the engine is configured (gateway.responders.build.tts_kind).
    configured = bool(engine.checkpoint or engine.endpoints)
    qwen3 = config.tts.engine == "qwen3" or (config.tts.engine == "auto" and configured)
    if qwen3 and not engine.checkpoint and not (engine.mode != "thread" and engine.endpoints):
        raise ConfigError('option tts.engine = "qwen3" needs [engine] checkpoint')
    if server.workers > 1 and engine.mode == "thread" and qwen3:
        raise ConfigError('several workers ([server] workers, --workers) with the Qwen3-TTS engine need [engine] '
                          'mode = "process" (or "auto"): in mode "thread" each worker would load its own copy of the '
                          'model')
    speech, voices = config.speech, config.voices
    for name in ("max_input_chars", "max_instructions_chars", "retry_after_s"):
        _at_least(f"speech.{name}", getattr(speech, name), 1)
    for name in ("max_streams", "max_waiting", "wait_timeout_s"):
        _at_least(f"speech.{name}", getattr(speech, name), 0)
    for name in ("max_voices", "max_consents", "max_file_bytes", "max_name_chars", "max_prompt_chars"):
        _at_least(f"voices.{name}", getattr(voices, name), 1)
    for name in ("max_sample_seconds", "max_consent_seconds"):
        if not 1.0 <= getattr(voices, name) <= 300.0:
            raise ConfigError(f"option voices.{name}: must be between 1 and 300, got {getattr(voices, name)}")
    for name in ("phrase_match", "similarity_threshold"):
        if not 0.0 <= getattr(voices, name) <= 1.0:
            raise ConfigError(f"option voices.{name}: must be between 0 and 1, got {getattr(voices, name)}")
    if not 64 <= semantic.pause_ms <= 2000:
        raise ConfigError(f"option semantic_vad.pause_ms: must be between 64 and 2000, got {semantic.pause_ms}")
    if semantic.recheck_ms and semantic.recheck_ms < 100:
        raise ConfigError(f"option semantic_vad.recheck_ms: must be 0 (off) or at least 100, got {semantic.recheck_ms}")
    if not 1 <= semantic.max_batch <= 64:
        raise ConfigError(f"option semantic_vad.max_batch: must be between 1 and 64, got {semantic.max_batch}")
    for level in ("low", "medium", "high"):
        threshold, wait = getattr(semantic, f"{level}_threshold"), getattr(semantic, f"{level}_max_wait_ms")
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"option semantic_vad.{level}_threshold: must be between 0 and 1, got {threshold}")
        if not semantic.pause_ms <= wait <= 60_000:
            raise ConfigError(f"option semantic_vad.{level}_max_wait_ms: must be between pause_ms "
                              f"({semantic.pause_ms}) and 60000, got {wait}")


def _check_proxies(setting: str) -> None:
    """[server] forwarded_allow_ips: "*", or addresses and networks (uvicorn would take anything else as a
    literal name that never matches, and the operator would not know)."""
    for entry in (part.strip() for part in setting.split(",") if part.strip()):
        if entry == "*":
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigError(f"option server.forwarded_allow_ips: {entry!r} is not an IP address or network "
                              "(e.g. 10.0.0.5, 10.0.0.0/8, or * for any)") from None


def _at_least(name: str, value: float, least: float) -> None:
    if value < least:
        raise ConfigError(f"option {name}: must be at least {least}, got {value}")


def _one_of(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"option {name}: expected {', '.join(choices[:-1])} or {choices[-1]}, got {value!r}")


def _voices(tables: dict[str, Any], folder: Path) -> dict[str, VoiceConfig]:
    """The [voices.NAME] tables, each a clone (reference, transcript) or a design (description)."""
    voices = {}
    for name, values in tables.items():
        where = f"voices.{name}"
        voice = VoiceConfig()
        _apply(voice, values, where)
        if bool(voice.reference) == bool(voice.description):
            raise ConfigError(f"option {where}: give either reference (a WAV to clone) or description (a voice "
                              "to design)")
        if voice.transcript and not voice.reference:
            raise ConfigError(f"option {where}.transcript: only a cloned voice (reference) has one")
        if voice.reference:
            voice.reference = str(folder / Path(voice.reference).expanduser())
        if not name.strip() or name.lower() in voices:
            raise ConfigError(f"option {where}: voice names must be non-empty and differ in more than case")
        voices[name.lower()] = voice
    return voices


def api_key(env_name: str) -> str:
    """The API key named by a config option; local servers often need none, so empty is allowed."""
    return os.environ.get(env_name, "") if env_name else ""
