"""Command line: ``python -m gateway serve | cert | client | replay``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from gateway.config import ConfigError, load_config


async def _serve(args: argparse.Namespace) -> int:
    from gateway.serve import GatewayServer  # noqa: PLC0415 - keeps `client` free of the server's imports

    config = load_config(args.config)
    if args.host:
        config.server.host = args.host
    if args.port is not None:
        config.server.port = args.port
    server = GatewayServer(config, insecure_no_auth=args.insecure_no_auth)
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
    await signalled.wait()
    await server.drain()
    await server.stop()
    return 0


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
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = {"serve": lambda args: asyncio.run(_serve(args))}
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
    logging.basicConfig(
        level=getattr(args, "log_level", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # uvicorn logs a line per WebSocket handshake; the gateway logs each session itself.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    # The openai package's HTTP client logs every request at INFO: a line per STT and LLM call of every
    # turn. The gateway logs the failed ones itself; --log-level DEBUG shows them all.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        return commands[args.command](args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
