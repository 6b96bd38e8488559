"""``python -m gateway cert DIR``: a local CA and a certificate for localhost, to serve wss:// and https://.

Writes DIR/ca.pem (the CA to trust: NODE_EXTRA_CA_CERTS, a browser's authorities, curl --cacert),
DIR/cert.pem (the server's certificate chain) and DIR/key.pem (its private key, mode 0600). The CA's
own key is thrown away once the certificate is signed, so the CA you trust can sign nothing else.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

import trustme

NAMES = ("localhost", "127.0.0.1", "::1")
FILES = ("ca.pem", "cert.pem", "key.pem")
VALID_DAYS = 365


def make_certificate(directory: Path, names: tuple[str, ...] = NAMES) -> tuple[Path, Path, Path]:
    """(ca.pem, cert.pem, key.pem) in ``directory``, made anew."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="voice-gateway local CA")
    now = datetime.datetime.now(datetime.UTC)
    leaf = ca.issue_cert(*names, common_name=names[0], not_before=now - datetime.timedelta(minutes=5),
                         not_after=now + datetime.timedelta(days=VALID_DAYS))
    ca_path, cert_path, key_path = (directory / name for name in FILES)
    ca.cert_pem.write_to_path(str(ca_path))
    cert_path.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key_path.touch(mode=0o600)
    os.chmod(key_path, 0o600)  # also when the file was there before
    leaf.private_key_pem.write_to_path(str(key_path))
    return ca_path, cert_path, key_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, help="folder for ca.pem, cert.pem and key.pem")
    parser.add_argument("--name", action="append", type=_name,
                        help=f"a name or address the certificate is for (repeatable; default: {', '.join(NAMES)})")
    parser.add_argument("--force", action="store_true",
                        help="replace certificate files already in DIR (the old CA is then trusted in vain)")


def _name(value: str) -> str:
    if not value.strip() or any(c.isspace() for c in value.strip()):
        raise argparse.ArgumentTypeError(f"expected a host name or an IP address, got {value!r}")
    return value.strip()


def run(args: argparse.Namespace) -> int:
    existing = [name for name in FILES if (args.dir / name).exists()]
    if existing and not args.force:
        # A CA someone has trusted must not be replaced by accident: its key is gone, so a new one is not
        # a renewal but a different authority every client would have to trust again.
        print(f"error: {args.dir} already has {', '.join(existing)}; --force replaces them", file=sys.stderr)
        return 2
    try:
        ca, cert, key = make_certificate(args.dir, tuple(args.name) if args.name else NAMES)
    except OSError as exc:
        print(f"error: cannot write the certificate files in {args.dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {ca} (the CA to trust), {cert} and {key} (valid {VALID_DAYS} days)\n"
          f"serve:  GATEWAY_SERVER_TLS_CERT={cert} GATEWAY_SERVER_TLS_KEY={key} make serve\n"
          f"Node:   NODE_EXTRA_CA_CERTS={ca} node app.js\n"
          f"curl:   curl --cacert {ca} https://localhost:8000/healthz")
    return 0
