"""One utterance between steps: its text feed, its talker state, its audio packets.

A stream advances one frame per step of engine.runner (which steps all running streams as one batch). In
dual-track mode frame k reads text token k, so a stream whose next token has not arrived yet is not
runnable: it sits the step out, its state untouched, and waits for text instead of reading tts_pad, because
tts_pad on the text track means "the text is over" to the model and invites an early EOS (the failure
users report when an LLM feed lags). Once the text is final, the frame after the last token reads tts_eos
and later frames read tts_pad, exactly as the official streaming-text mode does with text known upfront.
The model reads text about three times faster than it speaks it (one token per 80 ms frame), so a waiting
stream is still well ahead of playback whenever the feed averages more than 12.5 tokens a second.

A packet's text is the text whose speech starts in it. The frames tell which tokens the model has read,
which bounds that from above but runs ahead of the speech by the same factor of three; so a token counts
as started once a speaking-rate estimate says its speech begins (clamped to the tokens already read), and
the last packet takes whatever text is left. engine.runner steps a stream within a batch; only the worker
thread touches a stream.
"""

from __future__ import annotations

import bisect
import functools
import random
import unicodedata
from dataclasses import dataclass

import torch

from engine import prompt
from engine.checkpoint import Checkpoint
from engine.prompt import Prompt, PromptError, TextTokens, Voice
from engine.sampling import SamplingParams

# A stream taking a long text a window at a time takes its next window when fewer than this many of its
# tokens are left unread (a frame reads one, and the window is tokenized before the step that reads it).
TEXT_LEAD = 8


@dataclass
class Packet:
    pcm: bytes  # pcm16 mono 24 kHz
    text: str  # text whose speech starts in this packet
    codes: torch.Tensor  # [16, frames] the packet's codes
    last: bool = False  # the stream's last packet


@functools.lru_cache(maxsize=4096)  # called per character fed: the cache makes it a dictionary lookup
def speech_frames(ch: str) -> float:
    """Rough speaking time of one character, in 80 ms frames (only used to place text in packets)."""
    code = ord(ch)
    if 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF:
        return 2.8  # CJK ideographs, about 4.5 a second
    if 0x3040 <= code <= 0x30FF or 0xAC00 <= code <= 0xD7AF:
        return 1.8  # kana and hangul syllables, about 7 a second
    if unicodedata.category(ch).startswith("P"):
        return 2.0  # punctuation: a short pause
    return 0.85  # letters, digits and spaces, about 15 a second


class Stream:
    def __init__(self, ckpt: Checkpoint, tokens: TextTokens, voice: Voice, seed: int | None, packet_frames: int,
                 max_frames: int, min_frames: int = 2, non_streaming: bool = False,
                 first_packet_frames: int = 0, params: SamplingParams | None = None, text_window: int = 0) -> None:
        self.tokens, self.voice = tokens, voice
        self.model = ckpt.model
        self.seed = seed if seed is not None else random.getrandbits(32)
        self.params = params  # the stream's own sampling (None: the runner's)
        self.min_frames = max(2, min_frames)  # EOS is banned before this many frames (the official minimum: 2)
        self.packet_frames, self.max_frames = packet_frames, max_frames
        self.first_packet_frames = first_packet_frames or packet_frames  # fewer: audio starts sooner
        self.packets = 0
        self.non_streaming = non_streaming
        self.text = ""  # everything fed so far (NFC)
        self.final = False
        self.ids: list[int] = []
        self.starts: list[int] = []  # per token, the start of its span in self.text
        self.ends: list[int] = []  # per token, the end of its span in self.text
        # Per token, the estimated frame where its speech starts: made as packets need them (`onsets_through`),
        # off the path of a stream's first frame.
        self.onsets: list[float] = []
        self.costed = 0  # characters counted into self.cost
        self.cost = 0.0
        self.tokenized = 0  # characters of self.text already tokenized
        self.text_window = text_window  # characters tokenized at a time (0: all that is ready)
        self.next_token = 0  # the text token the next frame reads
        self.leftover: list[int] = []  # transcript tokens an ICL clone's prompt could not hold, read first
        self.eos_read = False
        self.row = -1  # the runner's batch row while the stream runs
        self.started = False  # prompt prefilled
        # The runner launches a frame before it reads the codes of the one before (engine.runner), so the
        # launch side (position, frames launched) runs one frame ahead of the codes taken.
        self.pos = 0  # talker position of the next frame launched
        self.launched = 0  # frames launched
        self.frame_cap = 0  # frames this stream may make (max_frames, and the cache's length)
        self.frames = 0  # frames taken (EOS not counted)
        self.pending: list[list[int]] = []  # the 16 codes of each frame not yet decoded
        self.spoken_text_end = 0  # characters attributed to emitted packets
        self.done = False

    # -- text side (the worker thread passes on what the event loop fed) --
    def add_text(self, fragment: str, final: bool) -> None:
        """Take in fed text and tokenize what is ready (engine.batcher does the two halves for many streams
        at once: `take_text`, one batched tokenizer call, `add_tokens`)."""
        piece = self.take_text(fragment, final)
        if piece[0]:
            self.add_tokens(*self.tokens.encode_ready([piece])[0])

    def take_text(self, fragment: str, final: bool) -> tuple[str, bool]:
        """Append fed text; returns the text to tokenize now ('' for none) and whether it is whole (all of
        the text, final), for TextTokens.encode_ready and then `add_tokens`. With a `text_window`, a longer
        rest is taken a window at a time, as the frames come near it (`wants_text`)."""
        if not self.text:
            fragment = fragment.lstrip()  # leading blanks would merge with the role's newline token
        self.text += TextTokens.normalize(fragment)
        self.final = self.final or final
        rest = self.text[self.tokenized:]
        window = self.text_window
        if window and not self.started:  # the prompt's own text first (an ICL clone's is longer)
            window = max(window, 8 * (self.voice.text_needed() - len(self.ids)))
        if window and len(rest) > window:
            return rest[:window], False
        return rest, self.final

    def add_tokens(self, taken: int, ids: list[int], spans: list[tuple[int, int]]) -> None:
        """The tokens of the first `taken` characters of what take_text returned, and their spans in it."""
        self.ids += ids
        self.starts += [self.tokenized + start for start, _ in spans]
        self.ends += [self.tokenized + end for _, end in spans]
        self.tokenized += taken
        if self.text_window and not taken and len(self.text) - self.tokenized > self.text_window:
            self.text_window *= 2  # a window holding no whole pre-token (a long run of CJK, say) grows
        if self.text_done and not self.ids:
            raise PromptError("empty text")

    @property
    def text_done(self) -> bool:
        """All of the text is in and tokenized."""
        return self.final and self.tokenized == len(self.text)

    @property
    def wants_text(self) -> bool:
        """Text a window left waits, and the frames come near it: the next tokens (all of them for a
        non-streaming prompt, the prompt's own before it starts)."""
        rest = len(self.text) - self.tokenized
        if not self.text_window or rest <= (0 if self.final else self.text_window):
            return False
        if self.non_streaming:
            return True
        need = TEXT_LEAD if self.started else self.voice.text_needed()
        return len(self.ids) - self.next_token < need

    def onsets_through(self, n: int) -> list[float]:
        """`onsets` of the first n tokens at least: the speaking time of the text before each token's start."""
        while len(self.onsets) < n:
            start = self.starts[len(self.onsets)]
            self.cost += sum(map(speech_frames, self.text[self.costed:start]))
            self.costed = max(self.costed, start)
            self.onsets.append(self.cost)
        return self.onsets

    @property
    def runnable(self) -> bool:
        if self.done or (self.started and self.launched >= self.frame_cap):
            return False
        if self.non_streaming:
            return self.text_done
        if not self.started:  # an ICL clone's prompt holds more than the first token
            return bool(self.ids) and (self.text_done or len(self.ids) >= self.voice.text_needed())
        return self.leftover != [] or self.next_token < len(self.ids) or self.text_done

    # -- model side (called by engine.runner.Runner) --
    def start(self) -> Prompt:
        """The stream's prompt (engine.prompt.build); the runner prefills it."""
        built = prompt.build(self.model.cfg, self.voice, self.tokens.role_ids, self.ids, self.non_streaming,
                             final=self.text_done)
        self.next_token, self.leftover, self.eos_read = built.text_read, built.leftover, built.eos_read
        self.started = True
        self.pos = len(built) - 1  # the last prompt position is the first step's input
        self.frame_cap = min(self.max_frames, self.model.max_len - self.pos)
        return built

    def launch(self) -> tuple[int, int, int]:
        """The inputs of this stream's next frame (position, text-track token, first frame 0/1), which the
        runner is about to launch."""
        first = self.launched == 0
        text = 0 if first else self.next_text_id()
        self.pos += 1
        self.launched += 1
        return self.pos - 1, text, int(first)

    def next_text_id(self) -> int:
        """The text-track token of the next frame launched (after the first)."""
        if self.leftover:
            return self.leftover.pop(0)
        if self.next_token < len(self.ids):
            self.next_token += 1
            return self.ids[self.next_token - 1]
        if not self.eos_read:
            self.eos_read = True
            return self.model.cfg.tts_eos
        return self.model.cfg.tts_pad

    def take(self, codes: list[int]) -> bool:
        """Record one frame's 16 codes; True when a packet is due (full, or the last)."""
        if codes[0] == self.model.cfg.codec_eos:
            self.done = True
            # With no frame left, a last packet still carries the text no packet has claimed (no audio).
            return bool(self.pending) or self.spoken_text_end < len(self.text)
        self.pending.append(codes)
        self.frames += 1
        if self.frames >= self.frame_cap:
            self.done = True
            return True
        return len(self.pending) >= (self.packet_frames if self.packets else self.first_packet_frames)

    def packet(self, pcm: bytes, codes: torch.Tensor) -> Packet:
        """The packet of the pending frames `codes` [16, n], decoded to `pcm`."""
        self.pending = []
        self.packets += 1
        # The last packet takes whatever text no packet has claimed (text the model never read included).
        if self.done:
            end = len(self.text)
        else:
            started = bisect.bisect_left(self.onsets_through(self.next_token), self.frames, hi=self.next_token)
            end = self.ends[started - 1] if started else 0
        text = self.text[self.spoken_text_end:end]
        self.spoken_text_end = max(self.spoken_text_end, end)
        return Packet(pcm=pcm, text=text, codes=codes, last=self.done)
