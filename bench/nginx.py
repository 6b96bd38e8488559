"""Gateways behind nginx on loopback, as deploy/nginx/gateway.conf sets them up: each gateway its own
`python -m gateway serve` process (echo responder, the same API key and signing key), and Debian's nginx run
as this user with a temporary prefix. Used by tests/server/test_balancer.py and the balancer suite."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.launcher import free_port

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "deploy" / "nginx" / "gateway.conf"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
API_KEY = "sk-balancer-" + "k" * 24
SIGNING_KEY = "balancer-signing-" + "s" * 32
START_TIMEOUT_S = 60.0


def nginx_missing() -> str | None:
    """Why the balancer cannot run here, or None."""
    return None if os.access(NGINX, os.X_OK) else f"nginx is not installed ({NGINX}; apt-get install nginx)"


class Gateway:
    """One gateway process on a loopback port; its log is kept (and read for the port it bound)."""

    def __init__(self, name: str, **settings: str | float) -> None:
        self.name = name
        # nginx on loopback is the trusted proxy (deploy/nginx/gateway.conf): its clients count apart.
        env = {**os.environ, "GATEWAY_API_KEYS": API_KEY, "GATEWAY_SIGNING_KEY": SIGNING_KEY,
               "GATEWAY_SERVER_FORWARDED_ALLOW_IPS": "127.0.0.1",
               "GATEWAY_RESPONDER_KIND": "echo", "GATEWAY_WEBRTC_ENABLED": "false", "GATEWAY_LOCAL_STT": "false",
               **{f"GATEWAY_{key.upper()}": str(value) for key, value in settings.items()}}
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", "0"], cwd=ROOT, env=env,
                                     stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self._bound = threading.Event()
        self.port = 0
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # read to the end, so the pipe never fills
            self.log.append(line)
            if not self.port and (match := re.search(r"gateway \S+ ready: open http://127\.0\.0\.1:(\d+)/", line)):
                self.port = int(match.group(1))
                self._bound.set()
        self._bound.set()

    def wait_started(self, timeout: float = START_TIMEOUT_S) -> None:
        if not self._bound.wait(timeout) or not self.port:
            raise RuntimeError(f"gateway {self.name} did not start:\n{''.join(self.log[-20:])}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def terminate(self) -> None:
        """SIGTERM: the gateway drains."""
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # ends its sessions at once
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def render_conf(gateway_ports: list[int], listen_port: int, prefix: Path) -> str:
    """A whole nginx.conf around deploy/nginx/gateway.conf: its upstream servers and listen line pointed at
    loopback, everything nginx writes under ``prefix``."""
    site = CONF.read_text()
    servers = re.findall(r"^\s*server \d+\.\d+\.\d+\.\d+:\d+ (.*);$", site, re.MULTILINE)
    assert servers, "deploy/nginx/gateway.conf has no upstream server lines to point at the test's gateways"
    options = servers[0]
    upstream = "".join(f"    server 127.0.0.1:{port} {options};\n" for port in gateway_ports)
    site = re.sub(r"(?:^\s*server \d+\.\d+\.\d+\.\d+:\d+ .*;\n)+", upstream, site, count=1, flags=re.MULTILINE)
    site, listens = re.subn(r"^(\s*)listen 80;$", rf"\1listen 127.0.0.1:{listen_port};", site, flags=re.MULTILINE)
    assert listens == 1, "deploy/nginx/gateway.conf has no 'listen 80;' line"
    temp = "\n".join(f"    {kind}_temp_path {prefix}/{kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                                              "uwsgi", "scgi"))
    # Started as root, nginx's workers would run as nobody, who may not write the temporary folders made here.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (f"{user}worker_processes 1;\npid {prefix}/nginx.pid;\nerror_log {prefix}/error.log warn;\n"
            f"events {{ worker_connections 1024; }}\n"
            f"http {{\n    access_log {prefix}/access.log;\n{temp}\n{site}\n}}\n")


class Nginx:
    def __init__(self, gateway_ports: list[int], prefix: Path) -> None:
        prefix.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        conf = prefix / "nginx.conf"
        conf.write_text(render_conf(gateway_ports, self.port, prefix))
        self.prefix = prefix
        self.proc = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log"),
                                      "-g", "daemon off;"], stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stderr.read() if self.proc.stderr else ''}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: its workers finish their requests
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def metric(url: str, name: str) -> float:
    """One unlabelled metric of a gateway's /metrics."""
    import urllib.request  # noqa: PLC0415

    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} is not in {url}/metrics"
    return float(found.group(1))


def holds(url: str, session_id: str) -> bool:
    """Whether the gateway at ``url`` holds this session (its latency trace is served only there)."""
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    request = urllib.request.Request(f"{url}/v1/realtime/sessions/{session_id}/turns",
                                     headers={"Authorization": f"Bearer {API_KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())["session_id"] == session_id
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
