"""What Twilio does on a call, for the tests (the remote side we cannot run), as its documentation has it: asks the
voice webhook, signed as Twilio signs it, opens the media stream, plays what comes back and echoes marks."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import urlencode

import aiohttp
import orjson
import websockets

TOKEN = "twilio-auth-token-for-tests"


def sign(url: str, params: dict[str, str]) -> str:
    """Twilio's documented X-Twilio-Signature: HMAC-SHA1 of the URL and the sorted parameters, base64."""
    payload = url + "".join(f"{k}{params[k]}" for k in sorted(params))
    return base64.b64encode(hmac.new(TOKEN.encode(), payload.encode(), hashlib.sha1).digest()).decode()


class TwilioSide:
    """What Twilio does on a call: asks the voice webhook, opens the stream, plays what comes back."""

    def __init__(self, gateway: Any) -> None:
        self.base = f"http://127.0.0.1:{gateway.port}"
        self.received: list[dict[str, Any]] = []
        self.marks_echoed: list[str] = []
        self.socket: Any = None
        self.stream_url = ""
        self.action = ""

    async def webhook(self, path: str, params: dict[str, str], signature: str | None = None) -> tuple[int, str]:
        url = self.base + path
        headers = {"X-Twilio-Signature": signature or sign(url, params),
                   "Content-Type": "application/x-www-form-urlencoded"}
        async with aiohttp.ClientSession() as http, http.post(url, data=urlencode(params), headers=headers) as answer:
            return answer.status, await answer.text()

    async def ring(self, call_sid: str = "CA0001") -> ET.Element:
        status, twiml = await self.webhook("/twilio/voice", {"CallSid": call_sid, "AccountSid": "AC1",
                                                             "From": "+15550001111", "To": "+15550002222"})
        assert status == 200, twiml
        root = ET.fromstring(twiml)
        connect = root.find("Connect")
        assert connect is not None, twiml
        stream = connect.find("Stream")
        assert stream is not None
        self.stream_url, self.action = stream.get("url", ""), connect.get("action", "")
        return stream

    async def open(self, call_sid: str = "CA0001", parameters: dict[str, str] | None = None) -> None:
        self.socket = await websockets.connect(self.stream_url)
        await self.socket.send(orjson.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}).decode())
        await self.socket.send(orjson.dumps({"event": "start", "sequenceNumber": "1", "streamSid": "MZ1", "start": {
            "streamSid": "MZ1", "accountSid": "AC1", "callSid": call_sid, "tracks": ["inbound"],
            "customParameters": parameters or {}, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                                                  "channels": 1}}}).decode())
        asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for text in self.socket:
                event = orjson.loads(text)
                self.received.append(event)
                if event["event"] == "mark":  # played at once: the gateway paces its media at real time
                    self.marks_echoed.append(event["mark"]["name"])
                    await self.socket.send(orjson.dumps({"event": "mark", "streamSid": "MZ1",
                                                         "mark": event["mark"]}).decode())

    async def say(self, frames: list[str]) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i, payload in enumerate(frames):
            await self.socket.send(orjson.dumps({"event": "media", "streamSid": "MZ1", "media": {
                "track": "inbound", "chunk": str(i + 1), "timestamp": str(i * 20), "payload": payload}}).decode())
            await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - loop.time()))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.received if e["event"] == kind]
