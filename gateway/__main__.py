"""Command line: ``python -m gateway serve | cert | client | replay``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.config import ConfigError, load_config

if TYPE_CHECKING:
    from gateway.serve import GatewayServer


def configure_logging(level: str, prefix: str = "") -> None:
    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s")
    # uvicorn logs a line per WebSocket handshake; the gateway logs each session itself.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    # The openai package's HTTP client logs every request at INFO: a line per STT and LLM call of every
    # turn. The gateway logs the failed ones itself; --log-level DEBUG shows them all.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("httpx2").setLevel(logging.WARNING)


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
    # [server] drain_seconds. SIGINT (Ctrl-C), or a second signal, ends every session now (1001).
    signalled = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if signalled.is_set() or sig == signal.SIGINT:
            server.gateway.hurry()
        signalled.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    task = asyncio.create_task(serving(server)) if serving is not None else None
    await signalled.wait()
    await server.drain()
    if task is not None:
        task.cancel()
    await server.stop()
    return 0


def _serve(args: argparse.Namespace) -> int:
    from gateway.serve import GatewayServer  # noqa: PLC0415 - keeps `client` free of the server's imports
    from gateway.workers import Workers, worker_count  # noqa: PLC0415

    config = load_config(args.config)
    if args.host:
        config.server.host = args.host
    if args.port is not None:
        config.server.port = args.port
    if args.workers is not None:
        config.server.workers = args.workers
    workers = worker_count(config)
    if workers > 1:
        return Workers(config, workers, insecure_no_auth=args.insecure_no_auth).run()

    async def serve() -> int:
        return await run_server(GatewayServer(config, insecure_no_auth=args.insecure_no_auth))

    return asyncio.run(serve())


def _workers(value: str) -> int:
    if value == "auto":
        return 0
    try:
        if (n := int(value)) >= 0:
            return n
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected a number of processes or auto, got {value!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description="Realtime voice gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", help="address to listen on (default from config: 127.0.0.1); another than "
                       "loopback needs GATEWAY_API_KEYS or --insecure-no-auth")
    serve.add_argument("--port", type=int, help="port to listen on (default from config: 8000)")
    serve.add_argument("--config", help="config file (default: the repository's config.toml)")
    serve.add_argument("--insecure-no-auth", action="store_true",
                       help="serve a non-loopback address with no API keys: anyone who reaches it may use it")
    serve.add_argument("--workers", type=_workers, help="worker processes sharing the port, the engine processes "
                       "and max_sessions (default from config: 0 = auto: one per CPU core less two per engine "
                       "process when a Qwen3-TTS engine runs in engine processes on a GPU, else 1)")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = {"serve": _serve}
    with contextlib.suppress(ImportError):
        from gateway import certs  # noqa: PLC0415

        certs.add_arguments(sub.add_parser("cert", help="make a local CA and a certificate for localhost"))
        commands["cert"] = certs.run
    with contextlib.suppress(ImportError):
        from gateway import client  # noqa: PLC0415

        client.add_arguments(sub.add_parser("client", help="talk to a gateway from a WAV file"))
        commands["client"] = client.run
    with contextlib.suppress(ImportError):
        from gateway import replay  # noqa: PLC0415

        replay.add_arguments(sub.add_parser("replay", help="replay WAV conversations headlessly"))
        commands["replay"] = replay.run
    args = parser.parse_args(argv)
    configure_logging(getattr(args, "log_level", "INFO"))
    try:
        return commands[args.command](args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
