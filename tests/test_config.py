"""The configuration's checks: every option's value is checked in one place, the error naming the option."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, check, load_config

BAD = [
    ("server", "drain_seconds", -1, "server.drain_seconds: must be at least 0"),
    ("server", "workers", -2, "server.workers: must be at least 0"),
    ("server", "request_body_timeout_s", 0.0, "server.request_body_timeout_s: must be > 0"),
    ("server", "request_idle_timeout_s", -1.0, "server.request_idle_timeout_s: must be > 0"),
    ("server", "max_request_headers", 129, "server.max_request_headers: must be between 1 and 128"),
    ("server", "max_header_line_bytes", 9000, "server.max_header_line_bytes: must be between 256 and 8190"),
    ("server", "max_connections_per_client", 0, "server.max_connections_per_client: must be at least 1"),
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
