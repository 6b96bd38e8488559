"""The one configuration: config.toml, then environment variables on top.

Every option lives in a dataclass below and is documented in config.toml, the defaults the package
ships (``voice-gateway config`` prints it: the start of a configuration of your own).
An environment variable ``GATEWAY_<SECTION>_<KEY>`` (upper case) overrides ``[section] key``, and any other
``GATEWAY_*`` variable than the few that are not options (``NOT_OPTIONS``, and the secrets that ``*_env``
options name) is refused, as a misspelt key in the file is. API keys are never read from the file, only from
the variables the file names.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from engine.config import EngineConfig
from gateway.shipped import DEFAULT_CONFIG


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the option."""


def bounded(default: Any, *, at_least: float | None = None, at_most: float | None = None,
            above: float | None = None, off: float | None = None, choices: tuple[str, ...] | None = None) -> Any:
    """An option with its bounds beside it, which ``validate`` keeps: at least ``at_least``, at most ``at_most``,
    more than ``above``, one of ``choices``; ``off`` is a value outside them that switches the option off."""
    bounds = {"at_least": at_least, "at_most": at_most, "above": above, "off": off, "choices": choices}
    return field(default=default, metadata={k: v for k, v in bounds.items() if v is not None})


# The sessions one H200 held at every latency target, with the 0.6B model and the 1.7B (docs/operations.md,
# "Sizing a host"): [server] max_sessions = 0 takes this many a GPU engine process, or this many where there is none.
SESSIONS_PER_GPU = 1000


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = bounded(8000, at_least=0, at_most=65535)
    web_dir: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    allowed_origins: str = ""
    allowed_hosts: str = ""
    max_message_bytes: int = bounded(22 * 1024 * 1024, at_least=64 * 1024)
    inbound_free_bytes: int = bounded(256 * 1024, at_least=0)
    inbound_budget_bytes: int = bounded(256 * 1024 * 1024, at_least=0)
    send_timeout_s: float = bounded(10.0, above=0)
    request_head_timeout_s: float = bounded(10.0, above=0)
    request_body_timeout_s: float = bounded(30.0, above=0)
    request_idle_timeout_s: float = bounded(5.0, above=0)
    # The websockets library, which parses a WebSocket handshake, takes at most 128 headers and 8 KiB lines.
    max_request_headers: int = bounded(100, at_least=1, at_most=128)
    max_header_line_bytes: int = bounded(8190, at_least=256, at_most=8190)
    max_connections_per_client: int = bounded(32, at_least=1)
    max_sessions_per_secret: int = bounded(4, at_least=1)
    forwarded_allow_ips: str = ""
    max_sessions: int = bounded(0, at_least=0)  # 0: auto (session_limit)
    drain_seconds: float = bounded(600.0, at_least=0)
    drain_notice_seconds: float = bounded(30.0, at_least=0)
    workers: int = bounded(0, at_least=0, at_most=256)  # past this many, processes would only contend
    worker_balance: str = bounded("connections", choices=("connections", "accept"))
    backend_check_s: float = bounded(15.0, at_least=0)
    ready_requires_backends: bool = False

    @property
    def session_limit(self) -> int:
        """max_sessions; its auto (0) is SESSIONS_PER_GPU until `serve` sizes the host
        (gateway.server.workers.worker_count makes it SESSIONS_PER_GPU a GPU engine process)."""
        return self.max_sessions or SESSIONS_PER_GPU


@dataclass
class SessionConfig:
    model: str = "gpt-realtime"
    voice: str = "alloy"
    instructions: str = "You are a helpful voice assistant. Answer briefly."
    max_append_bytes: int = bounded(15 * 1024 * 1024, at_least=1)
    max_buffer_seconds: float = bounded(900.0, above=0)
    idle_buffer_seconds: float = bounded(60.0, at_least=0)
    max_items: int = bounded(1000, at_least=1)
    max_audio_seconds: float = bounded(900.0, above=0)
    # The session's own configuration counts in it: a few KiB at the least.
    max_text_bytes: int = bounded(2 * 1024 * 1024, at_least=16 * 1024)
    max_out_of_band_responses: int = bounded(4, at_least=1)


@dataclass
class VadConfig:
    """The defaults of a session's turn_detection, within the bounds session.update holds a client to."""

    enabled: bool = True
    threshold: float = bounded(0.5, at_least=0, at_most=1)
    prefix_padding_ms: int = bounded(300, at_least=0, at_most=10_000)
    silence_duration_ms: int = bounded(500, at_least=0, at_most=10_000)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int = bounded(0, off=0, at_least=5_000, at_most=30_000)
    min_speech_ms: int = bounded(64, at_least=0, at_most=2_000)
    batch_interval_ms: float = bounded(10.0, at_least=0, at_most=1_000)
    device: str = bounded("auto", choices=("auto", "cpu", "engine"))


@dataclass
class SemanticVadConfig:
    model_path: str = ""
    # smart-turn-v3.2-cpu.onnx in pipecat-ai==1.14.0 (gateway.runtime.smart_turn.MODEL_SHA256)
    model_sha256: str = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
    pause_ms: int = bounded(200, at_least=64, at_most=2000)
    recheck_ms: int = bounded(0, off=0, at_least=100)
    low_threshold: float = bounded(0.7, at_least=0, at_most=1)
    medium_threshold: float = bounded(0.5, at_least=0, at_most=1)
    high_threshold: float = bounded(0.3, at_least=0, at_most=1)
    # At least pause_ms: checked with it (``check``).
    low_max_wait_ms: int = bounded(8000, at_most=60_000)
    medium_max_wait_ms: int = bounded(4000, at_most=60_000)
    high_max_wait_ms: int = bounded(2000, at_most=60_000)
    max_batch: int = bounded(1, at_least=1, at_most=64)
    device: str = bounded("auto", choices=("auto", "cpu", "engine"))


@dataclass
class ResponderConfig:
    kind: str = bounded("auto", choices=("auto", "echo", "pipeline", "local"))
    echo_pace: float = bounded(1.0, at_least=0)
    echo_chunk_ms: int = bounded(40, at_least=1, at_most=1000)


@dataclass
class SttConfig:
    base_url: str = ""
    model: str = "whisper-1"
    api_key_env: str = "STT_API_KEY"
    language: str = ""
    timeout_s: float = bounded(10.0, above=0)
    stream: bool = False
    audio_in: bool = False
    early_ms: int = bounded(200, at_least=0, at_most=10_000)


@dataclass
class LlmConfig:
    base_url: str = ""
    model: str = "gpt-4o-mini"
    api_key_env: str = "LLM_API_KEY"
    temperature: float = bounded(0.7, at_least=0, at_most=2)
    max_output_tokens: int = bounded(512, at_least=1)
    timeout_s: float = bounded(30.0, above=0)


@dataclass
class McpConfig:
    enabled: bool = True
    allowed_hosts: str = ""
    max_servers: int = bounded(8, at_least=1)
    list_timeout_s: float = bounded(10.0, above=0)
    call_timeout_s: float = bounded(30.0, above=0)
    max_response_bytes: int = bounded(1024 * 1024, at_least=1024)
    max_output_chars: int = bounded(20_000, at_least=1)
    max_tools: int = bounded(100, at_least=1)
    max_rounds: int = bounded(4, at_least=1)


@dataclass
class TtsConfig:
    engine: str = bounded("auto", choices=("auto", "tone", "piper", "qwen3"))
    starter_chars: int = bounded(24, at_least=1)
    max_segment_chars: int = bounded(160, at_least=1)
    language: str = "auto"


@dataclass
class LocalConfig:
    stt: bool = True
    stt_model: str = ""
    llm_model: str = ""
    cache_dir: str = ""
    max_output_tokens: int = bounded(60, at_least=1)
    context_tokens: int = bounded(512, at_least=1)
    cached_sessions: int = bounded(8, at_least=0)
    starter_chars: int = bounded(12, at_least=1)
    temperature: float = bounded(0.0, at_least=0, at_most=2)
    system_prompt: str = "You are a helpful voice assistant. Answer in one short sentence."
    examples: dict[str, str] = field(default_factory=lambda: {
        "How many wheels does a bicycle have?": "A bicycle has two wheels.",
        "What is the capital of Italy?": "The capital of Italy is Rome.",
        "What color is snow?": "Snow is white.",
    })
    stt_threads: int = bounded(2, at_least=1)
    llm_threads: int = bounded(1, at_least=1)
    tts_threads: int = bounded(1, at_least=1)


@dataclass
class WebRtcConfig:
    enabled: bool = True
    max_pending_calls: int = bounded(16, at_least=1)
    max_pending_calls_per_client: int = bounded(4, at_least=1)
    connect_timeout_s: float = bounded(15.0, above=0)
    ice_servers: str = ""
    turn_username: str = ""
    turn_credential_env: str = "TURN_CREDENTIAL"
    # aiortc's jitter buffer holds 16 packets: the prefetch must leave it room.
    jitter_prefetch: int = bounded(0, at_least=0, at_most=15)
    advertised_host: str = ""
    advertised_url: str = ""


@dataclass
class CallsConfig:
    webhook_urls: str = ""
    webhook_secret_env: str = "GATEWAY_WEBHOOK_SECRET"
    webhook_timeout_s: float = bounded(5.0, at_least=0.5, at_most=30)
    decision_timeout_s: float = bounded(15.0, at_least=1, at_most=300)
    max_pending_calls: int = bounded(32, at_least=1, at_most=10_000)
    max_pending_calls_per_source: int = bounded(4, at_least=1, at_most=10_000)
    noise_reduction: str = bounded("", choices=("", "near_field", "far_field"))


@dataclass
class SipConfig:
    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = bounded(5060, at_least=0, at_most=65535)
    tcp: bool = True
    tls_port: int = bounded(0, at_least=0, at_most=65535)
    tls_cert: str = ""
    tls_key: str = ""
    advertised_host: str = ""
    rtp_port_min: int = bounded(20000, at_least=1024, at_most=65534)
    rtp_port_max: int = bounded(20999, at_least=1025, at_most=65535)
    allowed_sources: str = ""
    username: str = ""
    password_env: str = "GATEWAY_SIP_PASSWORD"
    realm: str = "voice-gateway"
    max_calls: int = bounded(100, at_least=1, at_most=10_000)
    max_calls_per_source: int = bounded(10, at_least=1, at_most=10_000)
    invites_per_second: float = bounded(20.0, at_least=0.1, at_most=10_000)
    invites_per_second_per_source: float = bounded(5.0, at_least=0.1, at_most=10_000)
    max_message_bytes: int = bounded(16384, at_least=2048, at_most=65535)
    max_tcp_connections: int = bounded(128, at_least=1, at_most=10_000)
    max_tcp_connections_per_source: int = bounded(8, at_least=1, at_most=10_000)
    ack_timeout_s: float = bounded(32.0, at_least=1, at_most=64)
    media_timeout_s: float = bounded(60.0, at_least=5, at_most=3600)
    jitter_ms: int = bounded(40, at_least=0, at_most=200)


@dataclass
class TwilioConfig:
    enabled: bool = False
    public_url: str = ""
    auth_token_env: str = "TWILIO_AUTH_TOKEN"
    stream_token_ttl_s: float = bounded(30.0, at_least=5, at_most=300)


@dataclass
class LiveConfig:
    """[live]: GPT-Live sessions (/v1/live/sessions). Its voice model is the gateway's own conversational path (the
    [responder]), its delegated backend any OpenAI-compatible server."""

    models: str = "gpt-live-1,gpt-live-1.1"  # the model names served (a prefix such as openai/ is accepted)
    instructions: str = ""  # the voice model's instructions when a session sends none ("" = [session] instructions)
    voice: str = ""  # the voice that speaks an unmapped built-in name ("" = [session] voice)
    voices: dict[str, str] = field(default_factory=dict)  # built-in voice name -> TTS voice
    # how readily a pause ends the user's turn ([semantic_vad]'s levels)
    eagerness: str = bounded("high", choices=("low", "medium", "high", "auto"))
    # a user turn's transcription starts this far into a pause (or at Smart Turn's check, if sooner)
    early_transcription_ms: int = bounded(100, at_least=0, at_most=60_000)
    max_session_s: float = bounded(3600.0, above=0)  # a session's life: its expires_at, then it closes "expired"
    no_audio_timeout_s: float = bounded(30.0, above=0)  # a session without input audio this long closes "expired"
    # one append's content, in tokens (estimated: gateway.live.settings.tokens)
    max_append_tokens: int = bounded(500, at_least=1)
    max_pending_appends: int = bounded(32, at_least=1)  # appends waiting for their place on the timeline
    max_instructions_tokens: int = bounded(16384, at_least=1)
    max_input_tokens: int = bounded(8192, at_least=1)  # startup input history
    # delegations a session keeps (the oldest client one is forgotten beyond it)
    max_delegations: int = bounded(64, at_least=1)
    max_response_runs: int = bounded(4, at_least=1)  # Responses delegation runs at once
    max_response_items: int = bounded(64, at_least=1)  # response.item.create items waiting for response.create
    # input that may run ahead of the output's real-time pace before a client waits
    max_lead_ms: int = bounded(3000, at_least=1)
    usage_interval_s: float = bounded(15.0, above=0)  # session.usage.updated every this much of the timeline
    delegation_base_url: str = ""  # the Responses delegation's server ("" = [llm] base_url)
    delegation_api_key_env: str = "DELEGATION_API_KEY"  # its key's variable ("" or unset: [llm] api_key_env's)
    # "responses", "chat" (completions), or "auto": Responses where the server has it
    delegation_api: str = bounded("auto", choices=("auto", "responses", "chat"))
    delegation_model: str = ""  # the backend model to call whatever a session names ("" = the session's)
    delegation_timeout_s: float = bounded(120.0, above=0)


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
    max_input_chars: int = bounded(4096, at_least=1)
    max_instructions_chars: int = bounded(4096, at_least=1)
    max_streams: int = bounded(0, at_least=0)
    max_waiting: int = bounded(64, at_least=0)
    wait_timeout_s: float = bounded(10.0, at_least=0)
    retry_after_s: int = bounded(1, at_least=1)


@dataclass
class TranscriptionsConfig:
    max_file_bytes: int = bounded(25 * 1024 * 1024, at_least=1)
    max_seconds: float = bounded(600.0, at_least=1, at_most=7200)
    max_running: int = bounded(2, at_least=1)
    retry_after_s: int = bounded(1, at_least=1)


@dataclass
class VoicesConfig:
    """[voices]: the store of custom voices (its options), and the voices the engine prepares at start, one
    [voices.NAME] table each (`named`, lower-case names; the file only: no environment variable names one)."""

    dir: str = ""
    max_voices: int = bounded(20, at_least=1)
    max_consents: int = bounded(100, at_least=1)
    max_file_bytes: int = bounded(10 * 1024 * 1024, at_least=1)
    max_sample_seconds: float = bounded(30.0, at_least=1, at_most=300)
    max_consent_seconds: float = bounded(30.0, at_least=1, at_most=300)
    max_name_chars: int = bounded(256, at_least=1)
    max_prompt_chars: int = bounded(2000, at_least=1)
    phrase_match: float = bounded(0.8, at_least=0, at_most=1)
    similarity_threshold: float = bounded(0.5, at_least=0, at_most=1)
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
    calls: CallsConfig = field(default_factory=CallsConfig)
    sip: SipConfig = field(default_factory=SipConfig)
    twilio: TwilioConfig = field(default_factory=TwilioConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    live: LiveConfig = field(default_factory=LiveConfig)
    speech: SpeechConfig = field(default_factory=SpeechConfig)
    transcriptions: TranscriptionsConfig = field(default_factory=TranscriptionsConfig)
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


ENV_PREFIX = "GATEWAY_"
# The environment variables the gateway reads that are not options, all of them: secrets, which no file holds
# (gateway/runtime/auth.py). Any other GATEWAY_* variable must name an option.
API_KEYS_ENV = "GATEWAY_API_KEYS"
SIGNING_KEY_ENV = "GATEWAY_SIGNING_KEY"
NOT_OPTIONS = (API_KEYS_ENV, SIGNING_KEY_ENV)
# Where someone looks for them first: an option of that name says which variable it is.
SECRET_OPTIONS = {"server.api_keys": API_KEYS_ENV, "server.signing_key": SIGNING_KEY_ENV}

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
            raise ConfigError(f"unknown option {prefix}.{key}{_secret_hint(prefix, key)}")
        setattr(section, key, _coerce(value, hints[key], f"{prefix}.{key}"))


def _secret_hint(section: str, key: str) -> str:
    variable = SECRET_OPTIONS.get(f"{section}.{key}")
    return f" (a secret, which no option holds: set the environment variable {variable})" if variable else ""


def load_config(path: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None) -> Config:
    """The package's config.toml, then ``path`` over it (its options replace those it names), then GATEWAY_*
    overrides. The package's file differs from the dataclasses' defaults only in [engine.voices] (OpenAI's voice
    names on the CustomVoice speakers), which a file of one's own keeps unless it has that table itself."""
    env = os.environ if env is None else env
    config = Config()
    files = [DEFAULT_CONFIG] if DEFAULT_CONFIG.exists() else []
    if path is not None and Path(path) != DEFAULT_CONFIG:
        files.append(Path(path))
    for file in files:
        _apply_file(config, file)
    for name, why in FOREIGN_ENV.items():
        if name in env:
            raise ConfigError(f"environment variable {name}: {why}")
    sections = [f.name for f in dataclasses.fields(config)]
    overrides: dict[str, dict[str, str]] = {name: {} for name in sections}
    secrets = {*NOT_OPTIONS, *_secret_variables(config)}
    for variable, value in env.items():
        if not variable.startswith(ENV_PREFIX) or variable in secrets:
            continue
        section, key = _env_option(variable, sections)
        options = getattr(config, section)
        if key not in get_type_hints(type(options)) or (section == "voices" and key == "named"):
            raise ConfigError(f"environment variable {variable}: [{section}] has no option {key!r}"
                              f"{_secret_hint(section, key)}")
        overrides[section][key] = value
    for section, values in overrides.items():
        _apply(getattr(config, section), values, section)
    return config


def _apply_file(config: Config, file: Path) -> None:
    """One TOML file's options onto ``config``; ConfigError naming the file and what is wrong."""
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {file}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {file}: {getattr(exc, 'strerror', None) or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}") from None
    for name, values in data.items():
        if not hasattr(config, name):
            raise ConfigError(f"unknown config section [{name}] in {file}")
        if not isinstance(values, dict):
            raise ConfigError(f"{name} in {file} must be a section ([{name}] and its options), not a value")
        try:
            if name == "voices":  # its options, and a table per named voice
                config.voices.named = _voices({k: v for k, v in values.items() if isinstance(v, dict)}, file.parent)
                values = {k: v for k, v in values.items() if not isinstance(v, dict)}
            _apply(getattr(config, name), values, name)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (in {file})") from None


def _secret_variables(config: Config) -> list[str]:
    """The variables that options ending in ``_env`` name (GATEWAY_SIP_PASSWORD...): secrets, read as they are."""
    return [getattr(getattr(config, section.name), option.name) for section in dataclasses.fields(config)
            for option in dataclasses.fields(getattr(config, section.name)) if option.name.endswith("_env")]


def _env_option(variable: str, sections: list[str]) -> tuple[str, str]:
    """The (section, key) a GATEWAY_<SECTION>_<KEY> variable names; ConfigError naming it when it names none."""
    name = variable.removeprefix(ENV_PREFIX).lower()
    matches = [s for s in sections if name.startswith(s + "_") and len(name) > len(s) + 1]
    if not matches:
        raise ConfigError(f"environment variable {variable} names no option: GATEWAY_<SECTION>_<KEY> takes a "
                          f"section of {', '.join(sections)} (and {' and '.join(NOT_OPTIONS)} and the secrets that "
                          "options ending in _env name are read as they are)")
    section = max(matches, key=len)
    return section, name[len(section) + 1 :]


def validate(config: Config) -> None:
    """Every option within the bounds declared beside it (``bounded``; the engine's in its metadata), a
    ConfigError naming the first that is not."""
    for section in dataclasses.fields(config):
        options = getattr(config, section.name)
        for option in dataclasses.fields(options):
            if option.metadata:
                _within(f"{section.name}.{option.name}", getattr(options, option.name), option.metadata)


def _within(name: str, value: Any, bounds: Mapping[str, Any]) -> None:
    if (choices := bounds.get("choices")) is not None:
        if value not in choices:
            raise ConfigError(f"option {name}: expected {', '.join(choices[:-1])} or {choices[-1]}, got {value!r}")
        return
    if "off" in bounds and value == bounds["off"]:
        return
    least, most, above = bounds.get("at_least"), bounds.get("at_most"), bounds.get("above")
    if (least is None or value >= least) and (most is None or value <= most) and (above is None or value > above):
        return
    if least is not None and most is not None:
        need = f"between {_number(least)} and {_number(most)}"
    elif least is not None:
        need = f"at least {_number(least)}"
    elif above is not None:
        need = f"> {_number(above)}"
    else:
        need = f"at most {_number(most)}"
    if "off" in bounds:
        need = f"{_number(bounds['off'])} (off) or {need}"
    raise ConfigError(f"option {name}: must be {need}, got {value}")


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def check(config: Config) -> None:
    """Every option's value and how options go together, a ConfigError naming the first that is wrong. What a
    value needs of the machine (a file, a port, an installed extra, a model) is checked where it is used."""
    validate(config)
    server, semantic, engine = config.server, config.semantic_vad, config.engine
    _check_proxies(server.forwarded_allow_ips)
    for level in ("low", "medium", "high"):
        wait = getattr(semantic, f"{level}_max_wait_ms")
        if not semantic.pause_ms <= wait <= 60_000:
            raise ConfigError(f"option semantic_vad.{level}_max_wait_ms: must be between pause_ms "
                              f"({semantic.pause_ms}) and 60000, got {wait}")
    if not any(m.strip() for m in config.live.models.split(",")):
        raise ConfigError("option live.models: name at least one model")
    for name, url in (("stt.base_url", config.stt.base_url), ("llm.base_url", config.llm.base_url),
                      ("live.delegation_base_url", config.live.delegation_base_url)):
        parts = urllib.parse.urlsplit(url)
        if url and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ConfigError(f"option {name}: expected an http:// or https:// URL, got {redacted_url(url)!r}")
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
    _check_phones(config)


def redacted_url(url: str) -> str:
    """``url`` with the password of its user part (http://user:secret@host) masked, for a message or a log."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


def _check_phones(config: Config) -> None:
    """How [calls], [sip] and [twilio] options go together (each worker's share of the RTP ports is checked
    once the worker count is known: gateway.transports.sip.ports)."""
    calls, sip = config.calls, config.sip
    _not_above("calls.max_pending_calls_per_source", calls.max_pending_calls_per_source, calls.max_pending_calls)
    _not_above("sip.max_calls_per_source", sip.max_calls_per_source, sip.max_calls)
    _not_above("sip.invites_per_second_per_source", sip.invites_per_second_per_source, sip.invites_per_second)
    _not_above("sip.max_tcp_connections_per_source", sip.max_tcp_connections_per_source, sip.max_tcp_connections)
    if sip.rtp_port_max <= sip.rtp_port_min:
        raise ConfigError(f"option sip.rtp_port_max: must be above rtp_port_min ({sip.rtp_port_min}), got "
                          f"{sip.rtp_port_max}")
    if bool(sip.tls_cert) != bool(sip.tls_key) or bool(sip.tls_port) != bool(sip.tls_cert):
        raise ConfigError("option sip.tls_port: SIP over TLS needs tls_port, tls_cert and tls_key together")
    if sip.allowed_sources:
        _check_proxies(sip.allowed_sources, "sip.allowed_sources")
    if config.twilio.enabled and not config.twilio.public_url.startswith(("https://", "http://")):
        raise ConfigError("option twilio.public_url: Twilio needs the gateway's public URL (https://...) to point "
                          "its media stream at")


def _not_above(name: str, value: float, most: float) -> None:
    if value > most:
        raise ConfigError(f"option {name}: must be at most the total ({_number(most)}), got {_number(value)}")


def _check_proxies(setting: str, name: str = "server.forwarded_allow_ips") -> None:
    """[server] forwarded_allow_ips: "*", or addresses and networks (uvicorn would take anything else as a
    literal name that never matches, and the operator would not know)."""
    for entry in (part.strip() for part in setting.split(",") if part.strip()):
        if entry == "*":
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigError(f"option {name}: {entry!r} is not an IP address or network "
                              "(e.g. 10.0.0.5, 10.0.0.0/8, or * for any)") from None


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
