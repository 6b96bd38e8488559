"""Serving the app: uvicorn on one listening socket, with TLS when configured and the WebSocket limits.

uvicorn parses HTTP (httptools: 400 for malformed requests; gateway/server/protocols/http_protocol.py adds the bound on
a head's size, deadlines for heads and bodies, header bounds before a WebSocket hand-over, and a connection
budget per client address), the websockets library's sans-I/O protocol speaks WebSocket
(gateway/server/protocols/websocket_protocol.py adds the send deadline, the inbound bound and the handshake's). Behind a
proxy named in [server] forwarded_allow_ips, uvicorn takes the client's address from X-Forwarded-For; from
anyone else, never. The socket is bound here, before the server starts, so that a busy port is a clear error,
and so that the worker processes of `serve --workers N` (gateway.server.workers) accept on one socket their
parent bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, NoReturn

import uvicorn
from uvicorn.middleware.proxy_headers import _TrustedHosts

from gateway import __version__
from gateway.config import Config, ConfigError
from gateway.core.responder import Responder
from gateway.runtime.auth import Auth
from gateway.runtime.capacity import Capacity
from gateway.runtime.gateway import Gateway
from gateway.runtime.health import summary
from gateway.server.handoff import Handoff, adopt
from gateway.server.protocols import http_protocol
from gateway.server.protocols import websocket_protocol as ws_protocol
from gateway.server.protocols.per_client import ClientBudget
from gateway.transports.app import create_app
from gateway.transports.calls.routing import from_workers
from gateway.transports.calls.workers import CallWorkers
from gateway.transports.guard import is_loopback
from gateway.transports.sip import ports as sip_ports

log = logging.getLogger(__name__)

# HTTP requests and handshakes in flight beyond the sessions themselves; past that, new ones get 503.
CONNECTION_HEADROOM = 256
GRACEFUL_SHUTDOWN_S = 5


def check_exposure(config: Config, auth: Auth, insecure_no_auth: bool) -> None:
    """Nothing unauthenticated on a non-loopback address, unless the operator says so out loud."""
    host = config.server.host
    if is_loopback(host) or auth.required:
        return
    if not insecure_no_auth:
        raise ConfigError(
            f"refusing to serve {host or 'every address'} without authentication: set GATEWAY_API_KEYS "
            "(comma-separated keys), or pass --insecure-no-auth to let anyone who can reach it use it"
        )
    log.warning("serving %s with NO authentication (--insecure-no-auth): anyone who can reach it can use it, "
                "and the paid backends behind it", host)


def check_tls(config: Config) -> bool:
    """Whether TLS is on; a ConfigError naming the option when its files cannot be used."""
    cert, key = config.server.tls_cert, config.server.tls_key
    if not cert and not key:
        return False
    if not cert or not key:
        raise ConfigError("set both [server] tls_cert and tls_key (GATEWAY_SERVER_TLS_CERT, GATEWAY_SERVER_TLS_KEY)")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"[server] tls_cert / tls_key cannot be used ({cert}, {key}): {exc}") from None
    return True


def listen(host: str, port: int) -> socket.socket:
    """The listening socket. Made with proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that
    say so, and without it Nagle's algorithm holds each event sent right after another for the client's
    delayed ACK (10-40 ms)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ([server] port, or --port): {exc.strerror or exc}") from None
    return sock


def uvicorn_config(app: object, config: Config, private: bool = False) -> uvicorn.Config:
    """``private``: for a worker's private socket, where the other workers pass requests on: no TLS, no
    lifespan (the public server runs it), and no budget per client (each was counted where it came in)."""
    server = config.server
    limits = http_protocol.HttpLimits(server.request_head_timeout_s, server.request_body_timeout_s,
                                      server.request_idle_timeout_s, server.max_request_headers,
                                      server.max_header_line_bytes)
    # uvicorn's own reading of the list (its proxy-headers middleware rewrites the client's address with it):
    # the connection budget exempts exactly the peers whose X-Forwarded-For that middleware believes.
    forwarded = with_mapped(server.forwarded_allow_ips)
    proxies = _TrustedHosts(forwarded) if forwarded else None
    return uvicorn.Config(
        app,
        http=http_protocol.protocol_class(limits, ClientBudget(server.max_connections_per_client),
                                          lambda peer: private or (proxies is not None and peer in proxies)),
        ws=ws_protocol.protocol_class(server.send_timeout_s, server.inbound_free_bytes, server.inbound_budget_bytes,
                          server.max_message_bytes),
        ws_max_size=server.max_message_bytes,
        ws_per_message_deflate=False,
        limit_concurrency=server.session_limit + CONNECTION_HEADROOM,
        # Off unless configured: uvicorn would otherwise believe X-Forwarded-For from loopback (its default),
        # and any local client could pose as any address.
        proxy_headers=bool(forwarded) and not private,
        forwarded_allow_ips=forwarded or None,
        lifespan="off" if private else "on",
        server_header=False,
        access_log=False,
        log_config=None,
        ssl_certfile=None if private else server.tls_cert or None,
        ssl_keyfile=None if private else server.tls_key or None,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


def with_mapped(hosts: str) -> str:
    """``hosts`` (forwarded_allow_ips) with each IPv4 address and network also as IPv6 maps them: on a dual-stack
    socket ([server] host "::") an IPv4 proxy's peer address is "::ffff:10.0.0.5", and would match neither."""
    entries = [h.strip() for h in hosts.split(",") if h.strip()]
    mapped = []
    for entry in entries:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            continue  # "*" or a name: as uvicorn takes it
        if network.version == 4:
            mapped.append(f"::ffff:{network.network_address}" if "/" not in entry else
                          f"::ffff:{network.network_address}/{96 + network.prefixlen}")
    return ",".join(entries + mapped)


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the process that runs it decides what a signal means; it
    also serves connections accepted elsewhere (`adopt`)."""

    def __init__(self, config: uvicorn.Config, head_timeout_s: float) -> None:
        super().__init__(config)
        self.head_timeout_s = head_timeout_s
        self._adopting: set[asyncio.Task[Any]] = set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def adopt(self, sock: socket.socket) -> None:
        """Serve `sock`, a connection the parent of `serve --workers N` accepted, as if accepted here."""
        config = self.config
        protocol = functools.partial(config.http_protocol_class, config=config, server_state=self.server_state,
                                     app_state=self.lifespan.state)
        sock.setblocking(False)
        # A TLS handshake gets as long as a request head (asyncio's own limit is 60 s): the per-client budget
        # and the head deadline start once it is done (serve_tls does the same for a listener of its own).
        timeout = self.head_timeout_s if config.ssl is not None else None
        task = asyncio.get_running_loop().create_task(asyncio.get_running_loop().connect_accepted_socket(
            protocol, sock, ssl=config.ssl, ssl_handshake_timeout=timeout))
        self._adopting.add(task)
        task.add_done_callback(self._adopted)

    async def serve_tls(self, sock: socket.socket) -> None:
        """Take TLS connections on the listening ``sock`` with a handshake limit (uvicorn's own listener has
        asyncio's 60 s, before the per-client budget and the head deadline start): uvicorn closes it at its
        shutdown with its own."""
        config = self.config
        protocol = functools.partial(config.http_protocol_class, config=config, server_state=self.server_state,
                                     app_state=self.lifespan.state)
        self.servers.append(await asyncio.get_running_loop().create_server(
            protocol, sock=sock, ssl=config.ssl, ssl_handshake_timeout=self.head_timeout_s, backlog=config.backlog))

    def open_connections(self) -> int:
        """Connections open here, those being adopted included."""
        return len(self.server_state.connections) + len(self._adopting)

    def _adopted(self, task: asyncio.Task[Any]) -> None:
        self._adopting.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.debug("a handed-over connection failed before it was served: %s", exc)  # a TLS handshake, say


class GatewayServer:
    """One process serving the gateway on [server] host and port; or, as one of `serve --workers N`
    (gateway.server.workers), on the connections its parent hands it over `handoff` (gateway.server.handoff)
    or on the socket `sock` its parent bound (either way the parent checked the configuration), with its
    parent's `auth` (one signing key for client secrets) and counting its sessions in `capacity`, its slot
    of the counts the workers share; with phone calls on, `calls` is its place among the workers for them,
    and it also serves its app on its private socket there (gateway.transports.calls.routing)."""

    def __init__(self, config: Config, responder: Responder | None = None, insecure_no_auth: bool = False, *,
                 sock: socket.socket | None = None, handoff: Handoff | None = None, auth: Auth | None = None,
                 capacity: Capacity | None = None, calls: CallWorkers | None = None) -> None:
        self.config = config
        self.gateway = Gateway(config, responder, auth, capacity)
        self.app = create_app(config, gateway=self.gateway, workers=calls)
        self.calls = calls
        self._phones = self.app.state.phones
        self.insecure_no_auth = insecure_no_auth
        self._inherited = sock is not None or handoff is not None
        self._socket: socket.socket | None = sock
        self._handoff = handoff
        self._adopting: asyncio.Task[None] | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._private: _Server | None = None
        self._private_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        server = self.config.server
        if self._inherited:
            tls = bool(server.tls_cert)
        else:
            check_exposure(self.config, self.gateway.auth, self.insecure_no_auth)
            tls = check_tls(self.config)
            self._socket = listen(server.host, server.port)
            if self._phones.sip is not None:  # bound now, as the HTTP port: one taken is an error naming it
                self._phones.sip.use(sip_ports.bind(self.config.sip)[0])
        # The models load while the server already answers (/healthz "starting", sessions 503), not in the
        # app's lifespan, which then finds the gateway started: a failure is an error naming its cause, not
        # a traceback from inside uvicorn.
        loading = asyncio.create_task(self.gateway.start())
        if self._inherited:
            # One of several workers accepts connections only once it can serve them: until then (a worker
            # started again), the others take them all.
            await loading
        await asyncio.sleep(0)  # the gateway is marked started before uvicorn runs the lifespan
        self._server = _Server(uvicorn_config(self.app, self.config), self.config.server.request_head_timeout_s)
        # Over TLS the listener is ours (_Server.serve_tls), for its handshake limit.
        uvicorn_sockets = [self._socket] if self._socket is not None and not tls else []
        self._task = asyncio.create_task(self._server.serve(sockets=uvicorn_sockets))
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            loading.cancel()
            with contextlib.suppress(SystemExit):  # uvicorn exits when its startup fails
                self._task.result()
            raise ConfigError("the HTTP server did not start (see the log above)")
        if tls and self._socket is not None:
            await self._server.serve_tls(self._socket)
        if not loading.done():
            log.info("loading models; /healthz says starting until they are ready")
        try:
            await loading
        except BaseException:
            await self.stop()
            raise
        if self.calls is not None:
            await self._serve_privately(self.calls)
        if self._handoff is not None:
            uv = self._server
            self._adopting = asyncio.create_task(adopt(self._handoff, uv.adopt, uv.open_connections))
        scheme = "https" if tls else "http"
        # A wildcard address is not one to open: this machine's loopback reaches it.
        host = "127.0.0.1" if server.host in ("", "0.0.0.0") else "[::1]" if server.host == "::" else server.host
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        assert self.gateway.responder is not None
        log.info("gateway %s ready: open %s://%s:%d/ in a browser and press Start (Realtime API: %s://%s:%d/v1/realtime;"
                 " responder: %s; auth: %s)", __version__, scheme, host, self.port, "wss" if tls else "ws", host,
                 self.port, summary(self.gateway.responder, self.gateway.transcriber),
                 f"{len(self.gateway.auth.api_keys)} API key(s)" if self.gateway.auth.required else "off")

    async def _serve_privately(self, calls: CallWorkers) -> None:
        """The app on this worker's private socket, where the others pass on requests about its calls."""
        path = calls.path(calls.slot)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # this slot's worker before it (the folder is the gateway's own, 0700)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(512)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"this worker's private socket {path} cannot be made (TMPDIR): {exc}") from None
        self._private = _Server(uvicorn_config(from_workers(self.app), self.config, private=True),
                                self.config.server.request_head_timeout_s)
        self._private_task = asyncio.create_task(self._private.serve(sockets=[sock]))
        while not self._private.started and not self._private_task.done():
            await asyncio.sleep(0.01)
        if self._private_task.done():
            with contextlib.suppress(SystemExit):
                self._private_task.result()
            raise ConfigError(f"this worker's private socket {path} could not be served (see the log above)")

    @property
    def port(self) -> int:
        """The port it serves (a worker that is handed its connections serves its parent's: the config's)."""
        return self._socket.getsockname()[1] if self._socket is not None else self.config.server.port

    async def drain(self) -> None:
        """Stop taking sessions and let those running end within [server] drain_seconds (Gateway.drain;
        ``gateway.hurry()`` ends them now). Call ``stop`` after it."""
        server = self.config.server
        await self.gateway.drain(server.drain_seconds, server.drain_notice_seconds)

    async def stop(self) -> None:
        if self._adopting is not None:
            self._adopting.cancel()
        serving = [(server, task) for server, task in ((self._server, self._task), (self._private, self._private_task))
                   if server is not None and task is not None]
        for server, _ in serving:
            server.should_exit = True
        for _, task in serving:
            with contextlib.suppress(SystemExit):
                await task
        await self.gateway.stop()
        if self._phones.sip is not None:  # its sockets, should the app never have started
            await self._phones.sip.stop()
        if self._socket is not None:
            self._socket.close()
        if self._handoff is not None:
            self._handoff.end.close()


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run the serving coroutine on uvloop where it is installed (the default on Linux and macOS), else on
    asyncio's own loop: the same protocols on either, but uvloop's transports and scheduling take less CPU
    per message, and a gateway's messages are mostly 20 ms audio appends."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def exit_now(code: int) -> NoReturn:
    """End the serving process once the server has stopped: the log flushed, then out at once. The
    interpreter's own teardown would free the models' native memory (torch, CTranslate2, onnxruntime)
    object by object, seconds after every session and socket is already gone."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def run_server(server: GatewayServer,
                     serving: Callable[[GatewayServer], Awaitable[None]] | None = None) -> int:
    """Start `server` and serve until SIGINT or SIGTERM (running `serving` meanwhile), then drain and stop;
    2 (the reason on stderr) when it cannot start. One process does this, and so does each worker of
    `serve --workers N`."""
    try:
        await server.start()
    except ConfigError as exc:
        await server.stop()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # SIGTERM (a platform stopping the gateway) drains: no new session, the running ones may go on for
    # [server] drain_seconds; so does SIGHUP (its terminal closed), which would otherwise end the process with
    # no word to its sessions. SIGINT (Ctrl-C), or a second signal, ends every session now (1001).
    signalled = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if signalled.is_set() or sig == signal.SIGINT:
            server.gateway.hurry()
        signalled.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal, sig)
    task = asyncio.create_task(serving(server)) if serving is not None else None
    await signalled.wait()
    await server.drain()
    if task is not None:
        task.cancel()
    await server.stop()
    return 0
