"""``serve --workers N``: N worker processes serve the gateway on one port and share its engine processes,
its session count and its metrics.

One Python process is one event loop, and the loop (VAD, the protocol, base64, the backends' HTTP) is
what limits a gateway in front of a GPU engine. So the parent here checks the configuration (the same
errors as one process), binds the listening socket, starts the engine processes once (engine.supervisor,
[engine] mode = "process") and then N spawned workers, each a GatewayServer. The parent accepts every
connection and hands it to the worker with the fewest open connections (gateway.server.handoff; [server]
worker_balance = "connections"), or each worker accepts on its copy of the socket and the kernel gives a
connection to whichever accepts first ("accept"). The workers' Capacity objects share one array
(gateway.runtime.capacity), so
[server] max_sessions holds for the gateway; their metrics go to one private folder in prometheus_client's
multiprocess mode, so /metrics from any worker shows the whole gateway.

Phone calls spread over the workers too: the parent binds each worker's SIP sockets on the one [sip] port
(SO_REUSEPORT: gateway.transports.sip.ports), makes the arrays the phone lines' bounds share and a private
folder for the sockets where the workers pass each other requests about their calls
(gateway.transports.calls.routing).

A worker that dies is started again after a pause that grows while it keeps dying soon after its start;
its slot in the session counts is zeroed and its live gauges dropped, and the engine processes free its
streams when its heartbeats stop. SIGTERM and SIGINT are passed to every worker, which does what one
process does on them (a second one is passed on too), and SIGHUP as SIGTERM; the parent exits once every
worker has, and stops the engine processes last. A worker that cannot start at all (exit status 2: a
configuration error it printed) stops the gateway.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from types import FrameType
from typing import TYPE_CHECKING

# Nothing imported here may import prometheus_client: a worker imports this module before it sets
# PROMETHEUS_MULTIPROC_DIR, which prometheus_client reads once, when first imported. So the server itself
# (gateway.server.serve, whose metrics do) is imported in the functions that use it.
from engine.supervisor import EngineStartError, EngineSupervisor, resolve_devices
from gateway.config import SESSIONS_PER_GPU, Config, ConfigError, check
from gateway.logs import configure_logging
from gateway.responders.build import engine_mode, give_engine_models, tts_kind
from gateway.runtime.auth import Auth
from gateway.runtime.capacity import Capacity, Counts, shared_counts
from gateway.runtime.tally import clear_row
from gateway.server.handoff import Dispatcher, Handoff, Loads, handoff_pair
from gateway.transports.calls.workers import CallWorkers
from gateway.transports.sip import ports as sip_ports

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from starlette.types import ASGIApp

    from gateway.core.responder import Responder
    from gateway.server.serve import GatewayServer

log = logging.getLogger(__name__)

# A worker that lived this long before it died is started again after the shortest pause.
STABLE_S = 60.0
FIRST_PAUSE_S, LONGEST_PAUSE_S = 1.0, 30.0
CONFIG_ERROR = 2  # a worker's exit status when it cannot start (as `serve` exits)
# A worker's death wakes the parent through its sentinel pipe; a process it forked could keep that pipe
# open, so the parent also looks every few seconds.
CHECK_S = 5.0
# The sessions a worker serves by default. A worker's CPU per session falls as it serves more (each turn of
# its loop, each VAD batch, each engine request serves more sessions for the same fixed cost), but its VAD
# lateness grows: 100 held every target at 1 and 2 GPUs, 143 held them at 1 GPU only (docs/operations.md,
# "Sizing a host").
SESSIONS_PER_WORKER = 100


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_count(config: Config) -> int:
    """[server] workers and max_sessions, 0 (auto) resolved for this host. With a Qwen3-TTS engine in engine
    processes on GPUs (by default on a host with GPUs: [engine] mode "auto"), max_sessions is SESSIONS_PER_GPU a
    GPU and the workers one per SESSIONS_PER_WORKER of it, at most one per CPU core less two per engine process
    (its step loop and its CUDA launches); otherwise max_sessions is SESSIONS_PER_GPU and one worker. The
    options are checked first (gateway.config.check)."""
    check(config)
    server = config.server
    engines = gpu_engines(config) if not (server.workers and server.max_sessions) else 0
    server.max_sessions = server.max_sessions or SESSIONS_PER_GPU * max(1, engines)
    if server.workers or not engines:
        return server.workers or 1
    by_sessions = math.ceil(server.max_sessions / SESSIONS_PER_WORKER)
    return max(1, min(by_sessions, cpu_count() - 2 * engines))


def gpu_engines(config: Config) -> int:
    """The engine processes on GPUs this gateway uses (those of [engine] endpoints count as such), 0 for none;
    [engine] devices resolved once ("auto" asks torch in a child process)."""
    engine = config.engine
    if tts_kind(config) != "qwen3" or engine_mode(config) != "process":
        return 0
    if engine.endpoints:
        return len([e for e in engine.endpoints.split(",") if e.strip()])
    devices = resolve_devices(engine.devices, engine.device)
    if not any(d.startswith("cuda") for d in devices):
        return 0
    engine.devices = ",".join(devices)
    return len(devices)


@dataclasses.dataclass
class Hooks:
    """What a program that embeds the gateway (bench/serve.py, the benchmarks' gateway) adds to each worker:
    module-level functions (a spawned worker imports them by name)."""

    responder: Callable[[Config], Responder | None] | None = None  # the worker's responder (None: configured)
    serving: Callable[[GatewayServer], Awaitable[None]] | None = None  # runs while the worker serves
    app: Callable[[ASGIApp], ASGIApp] | None = None  # middleware around the worker's app (None: the app as it is)


@dataclasses.dataclass
class _Worker:
    slot: int
    process: BaseProcess | None = None
    ready: Event | None = None
    started: float = 0.0
    restarts: int = 0
    pause: float = 0.0  # the pause before its last restart
    due: float = 0.0  # when a dead worker is started again


class Workers:
    def __init__(self, config: Config, count: int, *, insecure_no_auth: bool = False, hooks: Hooks | None = None,
                 log_level: str | None = None) -> None:
        self.config = config
        self.count = count
        config.server.workers = count  # resolved: each worker shares the engine processes with count - 1 others
        self.insecure_no_auth = insecure_no_auth
        self.hooks = hooks or Hooks()
        self.log_level = log_level or logging.getLevelName(logging.getLogger().getEffectiveLevel())
        self._context = multiprocessing.get_context("spawn")  # each worker a fresh interpreter: no copied state
        self._workers = [_Worker(slot) for slot in range(count)]
        self._signals: list[int] = []
        self._socket: socket.socket | None = None
        self._counts: Counts | None = None
        self._metrics_dir = ""
        self._auth: Auth | None = None
        self._dispatcher: Dispatcher | None = None
        self._loads: Loads | None = None
        self._calls: CallWorkers | None = None
        self._sip_sockets: list[list[socket.socket]] = []

    def run(self) -> int:
        """Serve until a signal stops every worker; 2 when the gateway cannot start (the reason on stderr)."""
        from gateway.server.serve import check_exposure, check_tls, listen  # metrics: see the imports

        server = self.config.server
        supervisor: EngineSupervisor | None = None
        # From the start: a signal while the engine processes load stops the gateway once they have (their
        # start cannot be cut short), rather than the parent dying at once and leaving them behind.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        try:
            # One signing key: a client secret minted by one worker opens a session on any.
            self._auth = Auth.from_env(os.environ)
            check_exposure(self.config, self._auth, self.insecure_no_auth)
            check(self.config)
            check_tls(self.config)
            self._socket = listen(server.host, server.port)
            server.port = self._socket.getsockname()[1]  # the workers log it (port 0: the one picked)
            self._calls = self._phones()
            supervisor = self._start_engines()
            self._counts = shared_counts(self.count)
            if server.worker_balance == "connections":
                self._loads = Loads.shared(self.count)
                self._dispatcher = Dispatcher(self._socket, self._loads)
                self._dispatcher.start()
            self._metrics_dir = tempfile.mkdtemp(prefix="voice-gateway-metrics-")  # 0700: this user's only
            log.info("starting %d workers on %s:%d for at most %d sessions", self.count, server.host,
                     self._socket.getsockname()[1], server.session_limit)
            for worker in self._workers:
                if self._signals:  # stopped while starting: the rest are never started
                    break
                self._start(worker)
            return self._watch()
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return CONFIG_ERROR
        finally:
            if self._dispatcher is not None:
                self._dispatcher.stop()
            self._stop_workers()
            if supervisor is not None:
                supervisor.stop()
            if self._metrics_dir:
                shutil.rmtree(self._metrics_dir, ignore_errors=True)
            sip_ports.close(self._sip_sockets)
            if self._calls is not None:
                shutil.rmtree(self._calls.folder, ignore_errors=True)
            if self._socket is not None:
                self._socket.close()

    def _phones(self) -> CallWorkers | None:
        """With phone calls on: the SIP sockets of every worker, and what the workers share for their calls."""
        config = self.config
        if not config.sip.enabled and not config.twilio.enabled:
            return None
        if config.sip.enabled:
            sip_ports.check_rtp_share(config.sip, self.count)
            self._sip_sockets = sip_ports.bind(config.sip, self.count)
            config.sip.port = self._sip_sockets[0][0].getsockname()[1]  # port 0: the one picked
        # 0700, as the metrics folder: only this user reaches the workers' private sockets.
        return CallWorkers.make(self.count, tempfile.mkdtemp(prefix="voice-gateway-calls-"))

    def _start_engines(self) -> EngineSupervisor | None:
        """The engine processes every worker shares, when a Qwen3-TTS engine runs in engine processes that
        nobody else started ([engine] endpoints): the workers connect to their endpoints."""
        engine = self.config.engine
        if tts_kind(self.config) != "qwen3" or engine_mode(self.config) != "process" or engine.endpoints:
            return None
        if not engine.checkpoint:
            raise ConfigError('option tts.engine = "qwen3" needs [engine] checkpoint')
        give_engine_models(self.config)
        supervisor = EngineSupervisor.from_config(engine)
        try:
            supervisor.start(engine.start_timeout_s)
        except EngineStartError as exc:
            raise ConfigError(str(exc)) from None
        engine.endpoints = ",".join(supervisor.endpoints)
        return supervisor

    def _start(self, worker: _Worker) -> None:
        worker.ready = self._context.Event()
        listener, handoff, theirs = self._socket, None, None
        if self._dispatcher is not None and self._loads is not None:  # the parent accepts and hands them over
            listener = None
            ours, theirs = handoff_pair()
            handoff = Handoff(theirs, self._loads, worker.slot)
            self._dispatcher.started(worker.slot, ours, worker.ready)
        calls = None
        if self._calls is not None:
            sockets = self._sip_sockets[worker.slot] if self._sip_sockets else []
            calls = dataclasses.replace(self._calls, slot=worker.slot, sip_sockets=sockets)
        worker.process = self._context.Process(
            target=_worker_main, name=f"gateway-worker-{worker.slot}",
            args=(worker.slot, self.config, self._auth, listener, handoff, self._counts, calls, worker.ready,
                  self._metrics_dir, self.hooks, self.log_level),
        )
        worker.started = time.monotonic()
        worker.process.start()
        if theirs is not None:
            theirs.close()  # the worker holds its copy
        log.info("worker %d started (pid %d)", worker.slot, worker.process.pid)

    def _watch(self) -> int:
        """Wait for workers to exit; start again those that die while the gateway is not stopping."""
        while True:
            alive = [w for w in self._workers if w.process is not None and w.process.is_alive()]
            if self._signals and not alive:
                return 0
            due = [w.due for w in self._workers if w.process is None and not self._signals]
            timeout = max(0.0, min([*due, time.monotonic() + CHECK_S]) - time.monotonic())
            wait([w.process.sentinel for w in alive], timeout)  # a signal handler runs meanwhile, too
            for worker in self._workers:
                if worker.process is not None and not worker.process.is_alive():
                    if self._reap(worker):
                        return CONFIG_ERROR
                elif worker.process is None and not self._signals and time.monotonic() >= worker.due:
                    worker.restarts += 1
                    self._start(worker)

    def _reap(self, worker: _Worker) -> bool:
        """A worker has exited: free what it held and plan its restart; True when the gateway must stop."""
        from prometheus_client import multiprocess  # see the imports above

        process = worker.process
        assert process is not None and self._counts is not None and worker.ready is not None
        process.join()
        worker.process = None
        if self._dispatcher is not None:
            self._dispatcher.gone(worker.slot)
        held, self._counts[worker.slot] = self._counts[worker.slot], 0  # its only writer is gone
        if self._calls is not None:  # its calls are gone with it
            for array in (self._calls.sip_calls, self._calls.pending_calls, self._calls.sip_streams):
                clear_row(array, worker.slot)
        multiprocess.mark_process_dead(process.pid, self._metrics_dir)
        if self._signals:
            return False
        if process.exitcode == CONFIG_ERROR and not worker.ready.is_set() and worker.restarts == 0:
            log.error("worker %d could not start (see above); stopping the gateway", worker.slot)
            self._signal_workers(signal.SIGTERM)
            return True
        lived = time.monotonic() - worker.started
        worker.pause = FIRST_PAUSE_S if lived > STABLE_S or not worker.pause else min(2 * worker.pause, LONGEST_PAUSE_S)
        worker.due = time.monotonic() + worker.pause
        log.warning("worker %d (pid %d) exited with status %s after %.0f s, holding %d sessions; restarting it "
                    "in %.0f s", worker.slot, process.pid, process.exitcode, lived, held, worker.pause)
        return False

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if not self._signals:
            log.info("%s: stopping the workers", signal.Signals(sig).name)
        self._signals.append(sig)
        self._signal_workers(signal.SIGTERM if sig == signal.SIGHUP else sig)  # a hang-up drains, as SIGTERM does

    def _signal_workers(self, sig: int) -> None:
        for worker in self._workers:
            if worker.process is not None and worker.process.pid is not None and worker.process.is_alive():
                # A worker still starting has no handler yet: SIGINT would interrupt its imports with a
                # traceback, while SIGTERM's default ends it quietly (it holds no session).
                ready = worker.ready is not None and worker.ready.is_set()
                os.kill(worker.process.pid, sig if ready else signal.SIGTERM)

    def _stop_workers(self) -> None:
        """At the end (or a failure): workers still running get SIGTERM, then SIGKILL after a grace period."""
        if not any(w.process is not None and w.process.is_alive() for w in self._workers):
            return
        self._signal_workers(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for worker in self._workers:
            if worker.process is not None:
                worker.process.join(max(0.0, deadline - time.monotonic()))
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join()


def _worker_main(slot: int, config: Config, auth: Auth, sock: socket.socket | None, handoff: Handoff | None,
                 counts: Counts, calls: CallWorkers | None, ready: Event, metrics_dir: str, hooks: Hooks,
                 log_level: str) -> None:
    """One worker process: a GatewayServer on the connections its parent hands it (or on the parent's listening
    socket, [server] worker_balance = "accept"), until SIGTERM or SIGINT."""
    # Its own process group: a terminal's Ctrl-C reaches the parent only, which passes it on once.
    os.setpgrp()
    # Before anything imports prometheus_client: its metrics then live in files every worker reads.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    from gateway.server.serve import GatewayServer, exit_now, run_loop, run_server  # only now: see the imports above

    configure_logging(log_level, prefix=f"worker[{slot}] ")

    parent = os.getppid()

    async def orphaned() -> None:
        while os.getppid() == parent:  # a parent killed outright cannot pass a signal on
            await asyncio.sleep(1.0)
        log.warning("the parent process is gone; stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    async def serving(server: GatewayServer) -> None:
        ready.set()
        await asyncio.gather(orphaned(), *([hooks.serving(server)] if hooks.serving is not None else []))

    async def serve() -> int:
        responder = hooks.responder(config) if hooks.responder is not None else None
        server = GatewayServer(config, responder, sock=sock, handoff=handoff, auth=auth,
                               capacity=Capacity(config.server.session_limit, counts, slot), calls=calls)
        if hooks.app is not None:
            server.app = hooks.app(server.app)
        return await run_server(server, serving)

    exit_now(run_loop(serve()))
