"""The page's Calls tab in headless Chromium: a real phone (baresip) calls, the call shows as pending, the
page accepts it with an API key (the phone is answered), then hangs it up (the phone hears the BYE)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.chromium import CHROMIUM, open_page, until
from tests.phones.baresip import BARESIP, Baresip, phone_wav
from tests.phones.webhooks import SECRET, Receiver

pytest.importorskip("playwright.async_api", reason="Playwright for Python is not installed")
pytestmark = [
    pytest.mark.skipif(BARESIP is None, reason="baresip is not installed (apt-get install baresip)"),
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"),
    pytest.mark.slow,
]


async def test_a_pending_call_is_accepted_and_hung_up_from_the_page(phone_gateway: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("GATEWAY_API_KEYS", "page-key")
    async with Receiver() as receiver:  # the webhook reaches a receiver that decides nothing: the call waits
        gateway = await phone_gateway(calls__webhook_urls=receiver.url, calls__decision_timeout_s=60.0)
        phone = Baresip(tmp_path / "phone", phone_wav(tmp_path, "question_sky.wav", pad_s=20))
        await phone.start()
        problems: list[str] = []
        try:
            async with open_page(gateway, problems) as page:
                await page.fill("#api-key", "page-key")
                await page.click("#tabs [data-tab='calls']")
                await phone.command("dial", f"sip:agent@127.0.0.1:{gateway.app.state.phones.sip.port}")
                call_id = await receiver.call_id()
                await until(page, f"window.__calls.calls.some(c => c.id === '{call_id}' && "
                                      "c.status === 'pending')")
                await page.fill("#call-instructions", "Answer from the page.")
                await page.click(f"tr[data-call='{call_id}'] button[data-action='accept']")
                await phone.event("CALL_ESTABLISHED")
                (call,) = gateway.app.state.phones.calls.calls.values()
                assert call.runner.session.settings.instructions == "Answer from the page."
                await until(page, f"window.__calls.calls.some(c => c.id === '{call_id}' && "
                                      "c.status === 'answered')")
                await page.click(f"tr[data-call='{call_id}'] button[data-action='hang-up']")
                await phone.event("CALL_CLOSED")
                await until(page, "window.__calls.calls.length === 0")
        finally:
            await phone.stop()
    assert not problems, problems
    assert not gateway.sessions
