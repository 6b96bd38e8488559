"""The configuration's checks: every option's value is checked in one place, the error naming the option; the
bounds are declared beside the options and match the protocol's; config.toml shows the dataclasses' defaults; a
GATEWAY_* variable names an option or is refused; `python -m gateway serve` stops on a bad value with one line."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config import NOT_OPTIONS, Config, ConfigError, check, load_config, redacted_url, validate
from gateway.realtime.session import Session
from gateway.shipped import DEFAULT_CONFIG
from tests.paths import ROOT

BAD = [
    ("server", "drain_seconds", -1, "server.drain_seconds: must be at least 0"),
    ("server", "workers", -2, "server.workers: must be between 0 and 256"),
    ("server", "workers", 100_000, "server.workers: must be between 0 and 256, got 100000"),
    ("server", "request_body_timeout_s", 0.0, "server.request_body_timeout_s: must be > 0"),
    ("server", "request_idle_timeout_s", -1.0, "server.request_idle_timeout_s: must be > 0"),
    ("server", "max_request_headers", 129, "server.max_request_headers: must be between 1 and 128"),
    ("server", "max_header_line_bytes", 9000, "server.max_header_line_bytes: must be between 256 and 8190"),
    ("server", "max_connections_per_client", 0, "server.max_connections_per_client: must be at least 1"),
    ("llm", "base_url", "not a url", "llm.base_url: expected an http:// or https:// URL, got 'not a url'"),
    ("stt", "base_url", "ftp://user:secret@host/", r"stt.base_url: .* got 'ftp://user:\*\*\*@host/'"),
    ("server", "forwarded_allow_ips", "10.0.0.1, nginx.local",
     "server.forwarded_allow_ips: 'nginx.local' is not an IP address or network"),
    ("webrtc", "max_pending_calls_per_client", 0, "webrtc.max_pending_calls_per_client: must be at least 1"),
    ("server", "port", 99999, "server.port: must be between 0 and 65535, got 99999"),
    ("server", "backend_check_s", -1.0, "server.backend_check_s: must be at least 0"),
    ("session", "max_out_of_band_responses", 0, "session.max_out_of_band_responses: must be at least 1"),
    ("local", "temperature", 3.0, "local.temperature: must be between 0 and 2"),
    ("local", "stt_threads", 0, "local.stt_threads: must be at least 1"),
    ("responder", "kind", "robot", "responder.kind: expected auto, echo, pipeline or local, got 'robot'"),
    ("tts", "engine", "espeak", "tts.engine: expected auto, tone, piper or qwen3"),
    ("engine", "mode", "fork", "engine.mode: expected auto, thread or process"),
    ("engine", "heartbeat_ms", 0.0, "engine.heartbeat_ms: must be > 0"),
    ("semantic_vad", "pause_ms", 10, "semantic_vad.pause_ms: must be between 64 and 2000"),
    ("semantic_vad", "recheck_ms", 50, r"semantic_vad.recheck_ms: must be 0 \(off\) or at least 100"),
    ("semantic_vad", "high_threshold", 1.5, "semantic_vad.high_threshold: must be between 0 and 1"),
    ("semantic_vad", "low_max_wait_ms", 100, r"semantic_vad.low_max_wait_ms: must be between pause_ms \(200\)"),
]


def test_the_repositorys_config_passes() -> None:
    check(load_config(env={}))


@pytest.mark.parametrize(("section", "key", "value", "message"), BAD, ids=[f"{s}.{k}" for s, k, _, _ in BAD])
def test_a_bad_value_names_its_option(section: str, key: str, value: object, message: str) -> None:
    config = load_config(env={})
    setattr(getattr(config, section), key, value)
    with pytest.raises(ConfigError, match=message):
        check(config)


def test_uvicorns_proxy_variable_is_named_not_ignored() -> None:
    with pytest.raises(ConfigError, match=r"FORWARDED_ALLOW_IPS: .* \[server\] forwarded_allow_ips"):
        load_config(env={"FORWARDED_ALLOW_IPS": "10.0.0.5"})
    config = load_config(env={"GATEWAY_SERVER_FORWARDED_ALLOW_IPS": "10.0.0.5, 10.1.0.0/16, ::1"})
    check(config)
    assert config.server.forwarded_allow_ips == "10.0.0.5, 10.1.0.0/16, ::1"


def test_options_that_go_together() -> None:
    config = load_config(env={"GATEWAY_RESPONDER_KIND": "pipeline"})
    with pytest.raises(ConfigError, match=r'responder.kind = "pipeline" needs \[llm\] base_url'):
        check(config)
    config = load_config(env={"GATEWAY_TTS_ENGINE": "qwen3"})
    with pytest.raises(ConfigError, match=r'tts.engine = "qwen3" needs \[engine\] checkpoint'):
        check(config)
    config = load_config(env={"GATEWAY_ENGINE_CHECKPOINT": "/models/q", "GATEWAY_SERVER_WORKERS": "2",
                              "GATEWAY_ENGINE_MODE": "thread"})
    with pytest.raises(ConfigError, match='several workers .* need \\[engine\\] mode = "process"'):
        check(config)
    config.engine.mode = "process"
    check(config)


def test_phone_calls_spread_over_the_workers_each_with_rtp_ports_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Phones no longer hold a gateway to one process: `serve` on a GPU host runs its auto worker count with SIP
    on, and each worker takes a slice of the RTP range of its own, refused when a slice would be too small."""
    from engine import supervisor
    from gateway.server import workers
    from gateway.transports.sip.media import PortPool
    from gateway.transports.sip.ports import MIN_RTP_PAIRS, check_rtp_share

    config = load_config(env={"GATEWAY_SIP_ENABLED": "1", "GATEWAY_TWILIO_ENABLED": "1",
                              "GATEWAY_TWILIO_PUBLIC_URL": "https://voice.example.com", "GATEWAY_SERVER_WORKERS": "2"})
    check(config)
    monkeypatch.setattr(workers, "cpu_count", lambda: 16)
    monkeypatch.setattr(supervisor, "gpu_count", lambda python=None: 1)
    config = load_config(env={"GATEWAY_SIP_ENABLED": "1", "GATEWAY_TTS_ENGINE": "qwen3",
                              "GATEWAY_ENGINE_CHECKPOINT": "/models/q", "GATEWAY_SERVER_MAX_SESSIONS": "2000"})
    assert workers.worker_count(config) == 16 - 2

    sip = config.sip  # 20000-20999: 500 calls' ports
    slices = [PortPool("127.0.0.1", sip.rtp_port_min, sip.rtp_port_max, slot, 14).ports for slot in range(14)]
    assert sorted(p for ports in slices for p in ports) == list(range(20000, 20999, 2))
    assert all(35 <= len(ports) <= 36 for ports in slices)
    check_rtp_share(sip, 14)
    check_rtp_share(sip, 500 // MIN_RTP_PAIRS)
    with pytest.raises(ConfigError, match=r"option sip.rtp_port_max: 126 workers share .* widen the range"):
        check_rtp_share(sip, 126)


def bounded_options() -> list[tuple[str, str, dict[str, Any], Any]]:
    """(section, option, its bounds, its default) of every option that declares bounds."""
    config = Config()
    return [(section.name, option.name, dict(option.metadata), getattr(getattr(config, section.name), option.name))
            for section in dataclasses.fields(config)
            for option in dataclasses.fields(getattr(config, section.name)) if option.metadata]


def outside(bounds: dict[str, Any], default: Any) -> list[Any]:
    """Values just outside ``bounds``, of the option's type."""
    if "choices" in bounds:
        return ["no-such-choice"]
    step = 1 if isinstance(default, int) else 0.5
    values = []
    if "at_least" in bounds:
        values.append(bounds["at_least"] - step)
    if "above" in bounds:
        values.append(bounds["above"])
    if "at_most" in bounds:
        values.append(bounds["at_most"] + step)
    if "off" in bounds and bounds.get("at_least", bounds["off"]) - bounds["off"] > step:
        values.append(bounds["off"] + step)  # between off and the range
    return [type(default)(v) for v in values if v != bounds.get("off")]


def edges(bounds: dict[str, Any]) -> list[Any]:
    return [bounds[k] for k in ("at_least", "at_most", "off") if k in bounds] + list(bounds.get("choices", ()))


BOUNDED = bounded_options()


@pytest.mark.parametrize(("section", "option", "bounds", "default"), BOUNDED,
                         ids=[f"{s}.{o}" for s, o, _, _ in BOUNDED])
def test_every_bounded_option_refuses_what_is_outside_and_takes_its_edges(section: str, option: str,
                                                                        bounds: dict[str, Any], default: Any) -> None:
    values = outside(bounds, default)
    assert values, f"{section}.{option}: no value outside {bounds}"
    for value in values:
        config = load_config(env={})
        setattr(getattr(config, section), option, value)
        with pytest.raises(ConfigError, match=rf"^option {section}\.{option}: (must be|expected) .*got"):
            validate(config)
    for value in edges(bounds):
        config = load_config(env={})
        setattr(getattr(config, section), option, value)
        validate(config)


def test_every_number_and_every_named_choice_has_bounds() -> None:
    """A new option gets its bounds beside it: every int and float option declares them (a bool or a free string
    needs none)."""
    config = Config()
    unbounded = [f"{section.name}.{option.name}" for section in dataclasses.fields(config)
                 for option in dataclasses.fields(getattr(config, section.name))
                 if not option.metadata and isinstance(getattr(getattr(config, section.name), option.name), int | float)
                 and not isinstance(getattr(getattr(config, section.name), option.name), bool)]
    assert unbounded == []


def test_the_defaults_in_config_toml_are_the_dataclasses() -> None:
    """Every option is in config.toml, with the dataclass's default. The one difference: [engine.voices] maps
    OpenAI's voice names to the CustomVoice checkpoint's speakers in the file, while the engine on its own maps
    none."""
    shipped = tomllib.loads(DEFAULT_CONFIG.read_text())
    config = Config()
    for section in dataclasses.fields(config):
        defaults = getattr(config, section.name)
        for option in dataclasses.fields(defaults):
            name = f"{section.name}.{option.name}"
            if name in ("voices.named", "engine.voices"):  # [voices.NAME] tables are examples in comments
                continue
            assert option.name in shipped[section.name], f"{name} is not in config.toml"
            assert shipped[section.name][option.name] == getattr(defaults, option.name), name
    assert shipped["engine"]["voices"] and Config().engine.voices == {}


def session_update(config: Config, turn_detection: dict[str, Any]) -> str:
    session = Session(config)
    event = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad", **turn_detection}}}}}
    return session.handle(orjson.dumps(event))[0].event["type"]


@pytest.mark.parametrize("option", ["threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms"])
def test_the_vad_defaults_have_the_bounds_session_update_has(option: str) -> None:
    """A default the gateway starts with is one a client could have set: the same edges pass, the values just
    outside them are refused by both."""
    bounds, default = next((b, d) for s, o, b, d in BOUNDED if (s, o) == ("vad", option))
    config = load_config(env={})
    for value in edges(bounds):
        sent = None if "off" in bounds and value == bounds["off"] else value  # the protocol's off is null
        assert session_update(config, {option: sent}) == "session.updated", value
    for value in outside(bounds, default):
        assert session_update(config, {option: value}) == "error", value


def test_a_misspelt_environment_variable_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"^environment variable GATEWAY_SERVR_PORT names no option: "
                                          r"GATEWAY_<SECTION>_<KEY> takes a section of server, session"):
        load_config(env={"GATEWAY_SERVR_PORT": "9000"})
    with pytest.raises(ConfigError, match=r"^environment variable GATEWAY_SERVER_PROT: \[server\] has no option"):
        load_config(env={"GATEWAY_SERVER_PROT": "9000"})
    for name in ("GATEWAY_", "GATEWAY_SERVER", "GATEWAY_SERVER_", "GATEWAY_VOICES_NAMED"):
        with pytest.raises(ConfigError, match=f"environment variable {name}"):
            load_config(env={name: "1"})
    config = load_config(env={"GATEWAY_SEMANTIC_VAD_PAUSE_MS": "300", "GATEWAY_VAD_THRESHOLD": "0.6",
                              **{name: "secret-value-" + "x" * 32 for name in NOT_OPTIONS}})
    assert (config.semantic_vad.pause_ms, config.vad.threshold) == (300, 0.6)


def test_every_gateway_variable_the_code_names_is_an_option_or_listed() -> None:
    """The variables that are not options are all in NOT_OPTIONS: a name the gateway's code reads is either."""
    named = {m for path in (ROOT / "gateway").rglob("*.py")
             for m in re.findall(r"\bGATEWAY_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text())}
    assert {"GATEWAY_API_KEYS", "GATEWAY_SIGNING_KEY", "GATEWAY_SERVER_FORWARDED_ALLOW_IPS"} <= named
    for name in named - set(NOT_OPTIONS):
        load_config(env={name: "0"} if name != "GATEWAY_SERVER_FORWARDED_ALLOW_IPS" else {name: "10.0.0.1"})


BAD_AT_START = [
    ({"GATEWAY_VAD_THRESHOLD": "3"}, "option vad.threshold: must be between 0 and 1, got 3.0"),
    ({"GATEWAY_VAD_SILENCE_DURATION_MS": "-5"}, "option vad.silence_duration_ms: must be between 0 and 10000, got -5"),
    ({"GATEWAY_VAD_IDLE_TIMEOUT_MS": "100"}, "option vad.idle_timeout_ms: must be 0 (off) or between 5000 and 30000"),
    ({"GATEWAY_SERVER_MAX_SESSIONS": "-1"}, "option server.max_sessions: must be at least 0, got -1"),
    ({"GATEWAY_SEMANTIC_VAD_MAX_BATCH": "0"}, "option semantic_vad.max_batch: must be between 1 and 64, got 0"),
    ({"GATEWAY_ENGINE_DTYPE": "float8"}, "option engine.dtype: expected auto, float32, bfloat16 or float16"),
    ({"GATEWAY_WEBRTC_JITTER_PREFETCH": "16"}, "option webrtc.jitter_prefetch: must be between 0 and 15, got 16"),
    ({"GATEWAY_SERVR_PORT": "9000"}, "environment variable GATEWAY_SERVR_PORT names no option"),
    ({"GATEWAY_LLM_TEMPRATURE": "0.5"}, "environment variable GATEWAY_LLM_TEMPRATURE: [llm] has no option"),
    # Found only as the gateway starts: a checkpoint that is not there, a trace file in no folder.
    ({"GATEWAY_RESPONDER_KIND": "echo", "GATEWAY_TTS_ENGINE": "qwen3", "GATEWAY_ENGINE_MODE": "thread",
      "GATEWAY_ENGINE_DEVICE": "cpu", "GATEWAY_ENGINE_CHECKPOINT": "/nonexistent"},
     "checkpoint folder '/nonexistent' does not exist"),
    ({"GATEWAY_RESPONDER_KIND": "echo", "GATEWAY_TRACE_JSONL_PATH": "/nonexistent/trace.jsonl"},
     "option trace.jsonl_path: cannot write '/nonexistent/trace.jsonl'"),
    ({"GATEWAY_RESPONDER_KIND": "echo", "GATEWAY_SERVER_WEB_DIR": str(ROOT / "tests")},
     f"option server.web_dir: {ROOT / 'tests'} has no index.html to serve"),
    ({"GATEWAY_RESPONDER_KIND": "echo", "GATEWAY_VOICES_DIR": str(ROOT / "README.md" / "voices")},
     f"option voices.dir: cannot keep custom voices in {ROOT / 'README.md' / 'voices'} ({ROOT / 'README.md'}: "
     "not a folder)"),
    ({"GATEWAY_SERVER_API_KEYS": "sk-1"}, "environment variable GATEWAY_SERVER_API_KEYS: [server] has no option "
     "'api_keys' (a secret, which no option holds: set the environment variable GATEWAY_API_KEYS)"),
]


@pytest.mark.parametrize(("env", "message"), BAD_AT_START, ids=[next(iter(e)) for e, _ in BAD_AT_START])
def test_a_bad_option_stops_serve_with_one_line_naming_it(env: dict[str, str], message: str) -> None:
    answer = subprocess.run([sys.executable, "-m", "gateway", "serve", "--port", "0"], cwd=ROOT, capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=120)
    # One line, the last (the gateway may have logged its start before it found the problem).
    assert answer.returncode == 2 and answer.stderr.splitlines()[-1].startswith(f"error: {message}"), answer.stderr
    assert answer.stderr.count("error: ") == 1 and "Traceback" not in answer.stderr


def test_a_bad_option_in_the_file_stops_serve_too(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("[vad]\nsilence_duration_ms = -5\n")
    answer = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(path)], cwd=ROOT,
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert (answer.returncode, answer.stderr) == (
        2, "error: option vad.silence_duration_ms: must be between 0 and 10000, got -5\n")


def test_a_file_of_ones_own_is_read_over_the_shipped_one(tmp_path: Path) -> None:
    """A file naming a few options keeps the rest of the package's, [engine.voices] included (else every OpenAI
    voice name would be an unknown speaker); one with its own table replaces that table."""
    shipped = load_config(env={}).engine.voices
    assert shipped["alloy"] == "vivian"
    own = tmp_path / "gateway.toml"
    own.write_text("[server]\nport = 9000\n")
    config = load_config(own, env={})
    assert config.server.port == 9000 and config.engine.voices == shipped
    own.write_text('[engine.voices]\nalloy = "ryan"\n')
    assert load_config(own, env={}).engine.voices == {"alloy": "ryan"}


@pytest.mark.parametrize(("text", "words"), [
    ("server = 3\n", "server in {file} must be a section"),
    ("[server]\nprot = 9000\n", "(in {file})"),
    ("[server]\nport = \"x\"\n", "(in {file})"),
])
def test_a_mistake_in_a_file_names_the_file(tmp_path: Path, text: str, words: str) -> None:
    own = tmp_path / "gateway.toml"
    own.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(own, env={})
    assert words.format(file=own) in str(refused.value)


def test_a_password_in_a_backend_url_stays_out_of_logs() -> None:
    assert redacted_url("http://user:secret@llm.internal:8001/v1") == "http://user:***@llm.internal:8001/v1"
    assert redacted_url("http://llm.internal:8001/v1") == "http://llm.internal:8001/v1"
