"""Server-side playout of response audio: the queue behind every transport that plays the agent's voice
itself (a WebRTC track, a phone call's RTP stream, a Twilio media stream).

It is the session's playout buffer (gateway.runtime.session_runner.Playout): response audio comes in as
pcm16 24 kHz and is converted to the line's rate as it is queued; the line takes one frame per tick and
sends it. The queue counts how much of the current item has gone out (what the listener heard, so
barge-in truncates there) and reports output_audio_buffer.started / .stopped as the frames reach them.
Responses play one after another: an out-of-band response produced beside the conversation's waits its
turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)

TICK_S = 0.02  # the phone lines' frame: 20 ms
# Frames the clock sends at once to catch up after the loop was held up; more than that is lost time.
MAX_CATCH_UP = 5


class Feed(Protocol):
    """A streaming converter of pcm16 24 kHz samples to the line's rate."""

    def process(self, samples: np.ndarray) -> np.ndarray: ...

    def flush(self) -> np.ndarray: ...


@dataclass
class _Chunk:
    response_id: str
    item_id: str
    samples: np.ndarray  # int16 at the line's rate


class PlayoutQueue:
    """Response audio waiting to be played, taken ``frame_samples`` at a time (``take``).

    A response's audio is held back until ``cushion_samples`` are queued (or the response is done), so a
    producer at real-time pace whose chunks land just after a frame went out does not run dry at the next.
    """

    def __init__(self, rate: int, frame_samples: int, make_feed: Callable[[], Feed],
                 cushion_samples: int | None = None) -> None:
        self.rate = rate
        self.frame_samples = frame_samples
        self._make_feed = make_feed
        self._cushion = frame_samples if cushion_samples is None else cushion_samples
        # A converter per (response, item) being fed: responses running at once each keep their own filter.
        self._feeds: dict[tuple[str, str], Feed] = {}
        self._queue: deque[_Chunk] = deque()
        self._queued = 0  # samples in self._queue
        self._filling = True  # holding audio back until the cushion is queued
        self._playing: str | None = None  # response between its started and stopped events
        self._item: str | None = None  # item of the audio last sent
        self._item_samples = 0  # samples of self._item sent so far
        self._done: set[str] = set()  # responses whose response.done has been sent
        self.underruns = 0  # times a playing response ran dry: its audio came too late

    # Playout interface, called by the runner ---------------------------------------------------

    def play(self, response_id: str, item_id: str, pcm: bytes) -> None:
        feed = (response_id, item_id)
        if feed not in self._feeds:
            self._flush_feeds(response_id)  # the response's previous item is over
            self._feeds[feed] = self._make_feed()
        self._enqueue(response_id, item_id, self._feeds[feed].process(np.frombuffer(pcm, dtype="<i2")))

    def clear(self) -> tuple[str, float] | None:
        """Drop all queued audio; (item id, ms of it sent) for the item playing or about to play."""
        item = self._item if self._playing is not None else None
        heard = self._item_samples if item is not None else 0
        if item is None and self._queue:
            item = self._queue[0].item_id
        self._queue.clear()
        self._queued = 0
        self._filling = True
        self._feeds.clear()
        # Cleared, not stopped: the session answers with output_audio_buffer.cleared instead.
        self._playing = None
        self._item = None
        self._item_samples = 0
        self._done.clear()
        return (item, heard * 1000 / self.rate) if item is not None else None

    def finished(self, response_id: str) -> None:
        """The response's response.done went out: once its queued audio has played, it has stopped."""
        self._flush_feeds(response_id)
        if self._playing == response_id or any(c.response_id == response_id for c in self._queue):
            self._done.add(response_id)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing playing."""
        return not self._queue and self._playing is None

    # The line's side -------------------------------------------------------------------------------

    def take(self) -> tuple[np.ndarray, list[tuple[str, str]]]:
        """The next frame (silence where nothing plays) and the (event type, response id) it reached."""
        samples = np.zeros(self.frame_samples, dtype=np.int16)
        events: list[tuple[str, str]] = []
        if self._filling and self._queue and (
            self._queued >= self._cushion or self._queue[0].response_id in self._done
        ):
            self._filling = False
        if not self._filling:
            filled = self._fill(samples, events)
            if filled < self.frame_samples and self._playing is not None and self._playing not in self._done:
                self.underruns += 1
                self._filling = True
        if self._playing in self._done and not self._queue:
            events.append(("output_audio_buffer.stopped", self._playing))
            self._done.discard(self._playing)
            self._playing = None
            self._filling = True
        return samples, events

    def _fill(self, samples: np.ndarray, events: list[tuple[str, str]]) -> int:
        """Move queued audio into ``samples``; returns how many were filled."""
        filled = 0
        while filled < len(samples) and self._queue:
            chunk = self._queue[0]
            if chunk.response_id != self._playing and self._playing is not None and self._playing not in self._done:
                break  # the playing response's next audio is late: another response waits for its end
            n = min(len(samples) - filled, len(chunk.samples))
            samples[filled : filled + n] = chunk.samples[:n]
            filled += n
            self._queued -= n
            if n == len(chunk.samples):
                self._queue.popleft()
            else:
                chunk.samples = chunk.samples[n:]
            if chunk.response_id != self._playing:
                if self._playing is not None:
                    events.append(("output_audio_buffer.stopped", self._playing))
                    self._done.discard(self._playing)
                self._playing = chunk.response_id
                events.append(("output_audio_buffer.started", chunk.response_id))
            if chunk.item_id != self._item:
                self._item, self._item_samples = chunk.item_id, 0
            self._item_samples += n
        return filled

    def _enqueue(self, response_id: str, item_id: str, samples: np.ndarray) -> None:
        """Queue a response's audio after what it queued before (before another response's, when it plays now)."""
        if not len(samples):
            return
        chunk = _Chunk(response_id, item_id, samples)
        self._queued += len(samples)
        if not self._queue or self._queue[-1].response_id == response_id:
            self._queue.append(chunk)
            return
        last = next((i for i in range(len(self._queue) - 1, -1, -1) if self._queue[i].response_id == response_id), None)
        if last is not None:
            self._queue.insert(last + 1, chunk)
        elif response_id == self._playing:
            self._queue.appendleft(chunk)
        else:
            self._queue.append(chunk)

    def _flush_feeds(self, response_id: str) -> None:
        """The end of the response's audio still inside its converters."""
        for feed in [f for f in self._feeds if f[0] == response_id]:
            self._enqueue(*feed, self._feeds.pop(feed).flush())


Tick = Callable[[float], Awaitable[None]]


class MediaClock:
    """One task ticking every 20 ms on an absolute schedule for every line that paces its own media (each
    line's ``tick``): one wake-up per frame for all of them, not one per call."""

    def __init__(self) -> None:
        self.ticks: dict[object, Tick] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, key: object, tick: Tick) -> None:
        self.ticks[key] = tick
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    def remove(self, key: object) -> None:
        self.ticks.pop(key, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while self.ticks:
            due += TICK_S
            await asyncio.sleep(max(0.0, due - loop.time()))  # a late clock catches up without sleeping
            if loop.time() - due > MAX_CATCH_UP * TICK_S:
                due = loop.time()  # held up for long: that time is lost, the schedule starts again
            now = time.monotonic()
            results = await asyncio.gather(*(tick(now) for tick in list(self.ticks.values())), return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    log.error("a line's media tick failed", exc_info=result)

    async def stop(self) -> None:
        self.ticks.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
