"""A real SIP phone for the benchmarks and the tests: baresip (Debian's package), driven over its ctrl_tcp module.

Its aufile module plays a WAV file as the microphone and its sndfile filter records what it sends (``enc``)
and what it hears (``dec``), so a test can say a recorded question and listen to the answer with an
independent speech recognizer, and the phone suite can time the answer. Events (CALL_ESTABLISHED,
CALL_CLOSED, ...) come over the same connection as the answers to commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import orjson

from bench.launcher import free_port
from bench.load import FIXTURES

BARESIP = shutil.which("baresip")
MODULES = Path("/usr/lib/baresip/modules")


async def end(process: subprocess.Popen[bytes]) -> None:
    """Stop a SIP peer's process: asked first, killed if it has not gone within 5 s."""
    process.terminate()
    try:
        await asyncio.to_thread(process.wait, 5)
    except subprocess.TimeoutExpired:
        process.kill()


def free_sip_port() -> int:
    """A loopback port free for SIP over both UDP and TCP."""
    return free_port(socket.SOCK_DGRAM, socket.SOCK_STREAM)


# A port chosen free can be taken before baresip binds it (the ephemeral range is shared): a start that fails
# on a taken port picks new ports and tries again.
START_ATTEMPTS = 3


class Baresip:
    def __init__(self, folder: Path, microphone: Path, username: str = "phone", password: str = "",
                 transport: str = "udp", jitter_buffer: bool = True, sip_port: int = 0) -> None:
        """``sip_port``: the port it sends and takes SIP on (0: a free one), tried first."""
        self.folder = folder
        self.microphone = microphone
        self.jitter_buffer = jitter_buffer
        self.wanted_port = sip_port
        folder.mkdir(parents=True, exist_ok=True)
        auth = f";auth_pass={password}" if password else ""
        (folder / "accounts").write_text(f"<sip:{username}@127.0.0.1;transport={transport}>{auth};regint=0;"
                                         "audio_codecs=PCMU,PCMA\n")
        self.sip_port = self.ctrl_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.events: list[dict[str, Any]] = []
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _configure(self) -> None:
        self.sip_port, self.wanted_port = self.wanted_port or free_sip_port(), 0
        self.ctrl_port = free_port()
        rtp = free_port(socket.SOCK_DGRAM)
        (self.folder / "config").write_text("\n".join([
            f"module_path {MODULES}",
            f"sip_listen 127.0.0.1:{self.sip_port}",
            # Baresip 1.0's aufile has no player: the sndfile filter records what is decoded, and the audio bridge
            # plays it nowhere (its device pulls the decoded audio at real time).
            "audio_player aubridge,nowhere",
            f"snd_path {self.folder}",
            f"audio_source aufile,{self.microphone}",
            f"audio_alert aufile,{self.microphone}",
            "module g711.so", "module aufile.so", "module aubridge.so", "module sndfile.so",
            "module_app account.so", "module_app menu.so", "module_app ctrl_tcp.so",
            f"ctrl_tcp_listen 127.0.0.1:{self.ctrl_port}",
            f"rtp_ports {rtp}-{rtp + 20}",
            # Off: each packet is decoded, and so recorded, as it arrives (the phone suite times its arrival).
            *([] if self.jitter_buffer else ["jitter_buffer_delay 0-0"]),
            "",
        ]))

    async def start(self) -> None:
        assert BARESIP is not None
        for _ in range(START_ATTEMPTS):
            self._configure()
            self.process = subprocess.Popen([BARESIP, "-f", str(self.folder)], stdin=subprocess.DEVNULL,
                                            stdout=open(self.folder / "baresip.log", "wb"), stderr=subprocess.STDOUT)
            for _ in range(100):
                with contextlib.suppress(OSError):
                    self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.ctrl_port)
                    self._task = asyncio.create_task(self._read())
                    return
                if self.process.poll() is not None:
                    break
                await asyncio.sleep(0.1)
            await self.stop()
            if "Address already in use" not in self.log():
                break
        raise RuntimeError(f"baresip did not open its control port:\n{self.log()[-2000:]}")

    async def _read(self) -> None:
        assert self._reader is not None
        while True:
            length = await self._reader.readuntil(b":")
            data = await self._reader.readexactly(int(length[:-1]) + 1)
            self.events.append(orjson.loads(data[:-1]))
            self._changed.set()

    async def command(self, command: str, params: str = "") -> None:
        assert self._writer is not None
        body = orjson.dumps({"command": command, "params": params, "token": command})
        self._writer.write(str(len(body)).encode() + b":" + body + b",")
        await self._writer.drain()

    async def event(self, kind: str, timeout: float = 20.0) -> dict[str, Any]:
        """The first event of type ``kind`` (one already received counts)."""
        async with asyncio.timeout(timeout):
            while True:
                found = next((e for e in self.events if e.get("type") == kind), None)
                if found is not None:
                    return found
                self._changed.clear()
                await self._changed.wait()

    @property
    def recording(self) -> Path:
        """What the phone heard (the sndfile filter's decoder dump) of its last call."""
        dumps = sorted(self.folder.glob("dump-*-dec.wav"))
        assert dumps, f"baresip recorded nothing:\n{self.log()[-2000:]}"
        return dumps[-1]

    def log(self) -> str:
        return (self.folder / "baresip.log").read_text(errors="replace")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
        if self.process is not None:
            await end(self.process)


def phone_wav(folder: Path, name: str, pad_s: float = 8.0) -> Path:
    """A fixture question at 8 kHz with ``pad_s`` of silence after it (the phone keeps sending while it listens)."""
    out = folder / f"mic-{name}"
    subprocess.run(["sox", str(FIXTURES / name), "-r", "8000", "-c", "1", "-b", "16", str(out), "pad", "0",
                    str(pad_s)], check=True)
    return out
