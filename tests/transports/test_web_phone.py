"""The page on a phone: 390 CSS px wide in headless Chromium (a phone's viewport: touch, 3 device pixels a CSS
pixel), each tab in turn. Every element shown lies within the screen's width, its text is at least 11 px as
drawn (the latency chart's SVG text scaled as it is shown), no menu cuts its choice short, nothing overlaps the
chart's axis labels, and the full-page screenshot is the screen's width, no wider. The screenshots are kept
in artifacts/ (page-phone-*.png) for a person to look at.

The gateway has a speech-to-text and a one-voice speech engine and no Qwen3-TTS checkpoint, as the demo.
"""

from __future__ import annotations

import struct

import pytest

async_api = pytest.importorskip("playwright.async_api", reason="Playwright for Python is not installed")

from bench.fake_openai import FakeOpenAI  # noqa: E402 - after the skip
from tests.transports.test_web import ARTIFACTS, CHROMIUM, SPEECH, chromium_args, pipeline, until  # noqa: E402

if CHROMIUM is None:
    pytest.skip("chromium is not installed (Debian: apt-get install chromium)", allow_module_level=True)

PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 3, "is_mobile": True, "has_touch": True}
MIN_TEXT_PX = 11

# Every element the page shows, measured where Chromium laid it out: what does not fit, or is too small to read.
LAYOUT = """(minPx) => {
  const width = document.documentElement.clientWidth;
  const problems = [];
  const where = (el) => {
    const named = el.closest("[id]");
    return `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : named ? " in #" + named.id : ""}` +
      ` "${(el.textContent || el.value || "").trim().slice(0, 30)}"`;
  };
  const measure = document.createElement("canvas").getContext("2d");
  for (const el of document.body.querySelectorAll("*")) {
    if (!el.checkVisibility({ visibilityProperty: true })) continue;
    const box = el.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;
    if (box.left < -0.5 || box.right > width + 0.5) {
      problems.push(`${where(el)} spans ${box.left.toFixed(0)}..${box.right.toFixed(0)} px of ${width}`);
    }
    const style = getComputedStyle(el);
    const ownText = [...el.childNodes].some((n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
    if (ownText || ["SELECT", "INPUT", "TEXTAREA", "BUTTON"].includes(el.tagName)) {
      const scale = el instanceof SVGGraphicsElement ? el.getScreenCTM().a : 1;
      const px = parseFloat(style.fontSize) * scale;
      if (px < minPx) problems.push(`${where(el)}: text at ${px.toFixed(1)} px`);
    }
    if (el.tagName === "SELECT" && el.selectedIndex >= 0) {
      measure.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
      const text = el.options[el.selectedIndex].text;
      const room = el.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight) - 16; // its arrow
      if (measure.measureText(text).width > room) problems.push(`${where(el)} cuts its choice "${text}" short`);
    }
  }
  return problems;
}"""

# The chart's texts that overlap another of its texts (the empty chart's note on the axis' labels).
CHART_OVERLAPS = """() => {
  const texts = [...document.querySelectorAll("#latency-chart text")]
    .map((t) => [t.textContent, t.getBoundingClientRect()]);
  const overlaps = [];
  texts.forEach(([a, p], i) => texts.slice(i + 1).forEach(([b, q]) => {
    if (p.left < q.right && q.left < p.right && p.top < q.bottom && q.top < p.bottom) overlaps.push(`${a} / ${b}`);
  }));
  return overlaps;
}"""


def png_width(data: bytes) -> int:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", data[16:20])[0]


async def check_the_screen(page, name: str) -> None:
    assert await page.evaluate(LAYOUT, MIN_TEXT_PX) == [], name
    assert await page.evaluate(CHART_OVERLAPS) == [], name
    ARTIFACTS.mkdir(exist_ok=True)
    shot = await page.screenshot(path=str(ARTIFACTS / f"page-phone-{name}.png"), full_page=True)
    assert png_width(shot) == 390 * PHONE["device_scale_factor"], name  # nothing wider than the screen


async def test_each_tab_fits_a_phone(start_gateway) -> None:
    async with FakeOpenAI(reply="Eight legs.", transcript="How many legs does a spider have?") as fake:
        gateway = await start_gateway(pipeline(fake.base_url), stt__base_url=fake.base_url, stt__model="whisper-test")
        problems: list[str] = []
        async with async_api.async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=chromium_args(SPEECH))
            try:
                page = await (await browser.new_context(**PHONE)).new_page()
                page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
                await page.goto(f"http://127.0.0.1:{gateway.port}/")
                await until(page, "window.__voices.capabilities !== null")
                await check_the_screen(page, "conversation-idle")  # the empty chart

                await page.click("#connect")
                await until(page, "window.__gateway.turns.some((t) => t.marks.heard !== undefined)")
                await page.click("#connect")
                await until(page, "window.__gateway.state === 'idle'")
                await check_the_screen(page, "conversation")  # a turn's bars and their figures

                await page.click("#tabs [data-tab='speech']")
                await until(page, "window.__speech.capabilities !== null")
                await check_the_screen(page, "speech")
            finally:
                await browser.close()
    assert problems == []
