"""Command line: ``python -m gateway serve | config | cert | client | replay`` (installed as ``voice-gateway``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from gateway.clients import cli, replay
from gateway.config import ConfigError, check, load_config
from gateway.logs import configure_logging
from gateway.server import certs
from gateway.shipped import DEFAULT_CONFIG


def _serve(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.host is not None:
        config.server.host = args.host
    if args.port is not None:
        config.server.port = args.port
    if args.workers is not None:
        config.server.workers = args.workers
    check(config)  # a bad value from the file or the environment is one line too, before anything starts
    # Imported here, not above: a worker of `serve --workers N` is spawned from this module, and imports it
    # before it sets PROMETHEUS_MULTIPROC_DIR, which the server's metrics read once, when first imported.
    from gateway.server.serve import GatewayServer, exit_now, run_loop, run_server
    from gateway.server.workers import Workers, worker_count

    workers = worker_count(config)
    if workers > 1:
        return Workers(config, workers, insecure_no_auth=args.insecure_no_auth).run()

    async def serve() -> int:
        return await run_server(GatewayServer(config, insecure_no_auth=args.insecure_no_auth))

    exit_now(run_loop(serve()))


def _config(args: argparse.Namespace) -> int:
    """The default configuration, every option documented: the start of one of your own."""
    sys.stdout.write(DEFAULT_CONFIG.read_text())
    return 0


class Parser(argparse.ArgumentParser):
    """A bad command-line value gets one line naming it, not the usage and a traceback."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _port(value: str) -> int:
    try:
        if 0 <= (port := int(value)) <= 65535:
            return port
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535 (0: any free port), got {value!r}")


def _host(value: str) -> str:
    if value.strip() and not any(c.isspace() for c in value):
        return value
    raise argparse.ArgumentTypeError(f"expected an address or a host name, got {value!r}")


def _workers(value: str) -> int:
    if value == "auto":
        return 0
    try:
        if (n := int(value)) >= 0:
            return n
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected a number of processes or auto, got {value!r}")


def program_name() -> str:
    """The command as the user typed it, for the usage line and the errors: ``python -m gateway`` when run
    so (the interpreter's own name), else the installed script's name."""
    run_as_module = getattr(sys.modules["__main__"], "__spec__", None)
    if run_as_module is not None and run_as_module.name == __spec__.name:
        return f"{os.path.basename(sys.executable) or 'python'} -m gateway"
    return "voice-gateway"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=program_name(), description="Realtime voice gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", type=_host, help="address to listen on (default from config: 127.0.0.1); another than "
                       "loopback needs GATEWAY_API_KEYS or --insecure-no-auth")
    serve.add_argument("--port", type=_port, help="port to listen on (default from config: 8000)")
    serve.add_argument("--config", help="config file (default: the package's defaults, which `config` prints); "
                       "GATEWAY_<SECTION>_<KEY> variables override either")
    serve.add_argument("--insecure-no-auth", action="store_true",
                       help="serve a non-loopback address with no API keys: anyone who reaches it may use it")
    serve.add_argument("--workers", type=_workers, help="worker processes sharing the port, the engine processes "
                       "and max_sessions (default from config: 0 = auto: one per 100 of max_sessions, at most one per "
                       "CPU core less two per engine process, when a Qwen3-TTS engine runs in engine processes on "
                       "a GPU; else 1)")
    serve.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                       help="INFO (default): one line per session and per turn; DEBUG also shows the libraries' "
                       "own lines (aioice, transformers, HTTP requests)")
    sub.add_parser("config", help="print the default configuration (every option, documented) to start your own")
    commands = {"serve": _serve, "config": _config}
    for name, module, help in (("cert", certs, "make a local CA and a certificate for localhost"),
                               ("client", cli, "talk to a gateway from a WAV file"),
                               ("replay", replay, "replay WAV conversations headlessly")):
        module.add_arguments(sub.add_parser(name, help=help))
        commands[name] = module.run
    args = parser.parse_args(argv)
    configure_logging(getattr(args, "log_level", "INFO"))
    try:
        return commands[args.command](args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
