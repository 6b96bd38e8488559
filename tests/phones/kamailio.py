"""Kamailio (Debian's) as the trunk's proxy in front of the gateway: it Record-Routes every call to user
"agent" on to the gateway, routes in-dialog requests (the gateway's BYE and REFER) back by their Route
headers, and logs each request it sees, so a test can tell what passed through it."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

from bench.phones import end
from tests.phones.baresip import free_sip_port

KAMAILIO = shutil.which("kamailio") or (shutil.which("kamailio", path="/usr/sbin"))
MODULES = "/usr/lib/x86_64-linux-gnu/kamailio/modules/"

CONFIG = """#!KAMAILIO
debug=1
log_stderror=yes
fork=no
children=1
auto_aliases=no
listen=udp:127.0.0.1:{port}
mpath="{modules}"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "rr.so"
loadmodule "pv.so"
loadmodule "xlog.so"
loadmodule "textops.so"
loadmodule "siputils.so"
loadmodule "maxfwd.so"

request_route {{
    xlog("L_ALERT", "proxy saw $rm $ru from $si:$sp\\n");
    if (!mf_process_maxfwd_header("10")) {{ sl_send_reply("483", "Too Many Hops"); exit; }}
    if (has_totag()) {{
        if (loose_route()) {{ t_relay(); exit; }}
        if (is_method("ACK")) {{ if (t_check_trans()) {{ t_relay(); }} exit; }}
        sl_send_reply("404", "Not here");
        exit;
    }}
    if (is_method("CANCEL")) {{ if (t_check_trans()) {{ t_relay(); }} exit; }}
    record_route();
    if ($rU == "agent") {{ $du = "sip:127.0.0.1:{gateway}"; t_relay(); exit; }}
    sl_send_reply("404", "Nobody here by that name");
}}
"""


class Kamailio:
    def __init__(self, folder: Path, gateway_port: int) -> None:
        self.folder = folder
        self.port = free_sip_port()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kamailio.cfg").write_text(CONFIG.format(port=self.port, modules=MODULES, gateway=gateway_port))
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        assert KAMAILIO is not None
        self.process = subprocess.Popen(
            [KAMAILIO, "-f", str(self.folder / "kamailio.cfg"), "-DD", "-E", "-Y", str(self.folder), "-P",
             str(self.folder / "kamailio.pid"), "-w", str(self.folder)],
            stdin=subprocess.DEVNULL, stdout=open(self.folder / "kamailio.log", "wb"), stderr=subprocess.STDOUT)
        for _ in range(50):
            if "listening on" in self.log() or "udp: 127.0.0.1" in self.log():
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        assert self.process.poll() is None, self.log()

    def log(self) -> str:
        return (self.folder / "kamailio.log").read_text(errors="replace")

    def saw(self, method: str) -> list[str]:
        return [line for line in self.log().splitlines() if f"proxy saw {method} " in line]

    async def stop(self) -> None:
        if self.process is not None:
            await end(self.process)
