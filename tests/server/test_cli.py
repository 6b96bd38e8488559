"""The command line: every bad value gets one line naming it and exit status 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.__main__ import main
from tests.paths import FIXTURES, ROOT

WAV = str(FIXTURES / "one_sentence.wav")

BAD = [
    (["serve", "--port", "99999"], "argument --port: expected a port number from 0 to 65535"),
    (["serve", "--host", ""], "argument --host: expected an address or a host name, got ''"),
    (["serve", "--workers", "100000"], "option server.workers: must be between 0 and 256, got 100000"),
    (["serve", "--port", "http"], "argument --port: expected a port number"),
    (["serve", "--workers", "-1"], "argument --workers: expected a number of processes or auto"),
    (["serve", "--log-level", "loud"], "argument --log-level: invalid choice: 'LOUD'"),
    (["serve", "--config", "/nonexistent/gateway.toml"], "config file not found: /nonexistent/gateway.toml"),
    (["serve", "--config", str(ROOT / "gateway")], "cannot read config file"),
    (["serve", "--bogus"], "unrecognized arguments: --bogus"),
    (["client", "--wav", WAV, "--url", "http://127.0.0.1:8000/v1/realtime"], "not a WebSocket URL"),
    (["client", "--wav", WAV, "--url", "ws://127.0.0.1:99999/v1/realtime"], "Port out of range 0-65535"),
    (["client", "--wav", WAV, "--webrtc", "--signalling-url", "http://127.0.0.1:99999/"], "Port out of range"),
    (["client", "--wav", "/no/such.wav"], "error: /no/such.wav: no such file"),
    (["replay", "--out", "r", "--speed", "0", "a.wav"], "argument --speed: '0' is not a positive number"),
    (["cert", "certs", "--name", "two words"], "argument --name: expected a host name or an IP address"),
    (["cert", "/proc/no-such-dir"], "error: cannot write the certificate files in /proc/no-such-dir"),
    (["launch"], "argument command: invalid choice: 'launch'"),
]


def test_cert_keeps_a_ca_already_made_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The CA's key is thrown away, so a second run would make a different CA: every client that trusted the
    first would fail. It is refused, and --force replaces the files on purpose."""
    assert main(["cert", str(tmp_path)]) == 0
    first = (tmp_path / "ca.pem").read_bytes()
    capsys.readouterr()
    assert main(["cert", str(tmp_path), "--name", "gateway.lan"]) == 2
    refusal = f"error: {tmp_path} already has ca.pem, cert.pem, key.pem; --force replaces them\n"
    assert capsys.readouterr().err == refusal
    assert (tmp_path / "ca.pem").read_bytes() == first
    assert main(["cert", str(tmp_path), "--name", "gateway.lan", "--force"]) == 0
    assert (tmp_path / "ca.pem").read_bytes() != first


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_value_is_one_line_naming_it(argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # where a client would write its reply.wav
    with pytest.raises(SystemExit) as exited:
        code = main(argv)
        raise SystemExit(code)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_a_bad_value_in_the_environment_is_one_line_too():
    """GATEWAY_SERVER_PORT=99999 reaches the same check, before anything binds (no OverflowError)."""
    answer = subprocess.run([sys.executable, "-m", "gateway", "serve"], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "GATEWAY_SERVER_PORT": "99999"}, timeout=120)
    assert answer.returncode == 2
    assert answer.stderr == "error: option server.port: must be between 0 and 65535, got 99999\n"


SCRIPT = Path(sys.executable).with_name("voice-gateway")  # the installed script beside the interpreter


@pytest.mark.parametrize("how", ["module", "script"])
def test_usage_and_errors_name_the_command_as_it_was_typed(how: str):
    """`python -m gateway` and the installed `voice-gateway` each say their own name, in the usage line and in
    the error's pointer to the help."""
    if how == "module":
        command, name = [sys.executable, "-m", "gateway"], f"{Path(sys.executable).name} -m gateway"
    elif SCRIPT.exists():
        command, name = [str(SCRIPT)], "voice-gateway"
    else:
        pytest.skip(f"no installed voice-gateway script beside {sys.executable}")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}  # this checkout's gateway, whatever is installed
    shown = subprocess.run([*command, "--help"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0 and shown.stdout.startswith(f"usage: {name} [-h] {{serve,"), shown.stdout
    refused = subprocess.run([*command, "serve", "--port", "http"], cwd=ROOT, capture_output=True, text=True,
                             env=env, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.endswith(f"(see {name} serve --help)\n"), refused.stderr
