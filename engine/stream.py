"""One utterance between steps: its text feed, its talker state, its audio packets.

A stream advances one frame per `step`. In dual-track mode frame k reads text token k, so a stream whose
next token has not arrived yet is not runnable: it waits for text instead of reading tts_pad, because
tts_pad on the text track means "the text is over" to the model and invites an early EOS (the failure
users report when an LLM feed lags). Once the text is final, the frame after the last token reads tts_eos
and later frames read tts_pad, exactly as the official streaming-text mode does with text known upfront.
The model reads text about three times faster than it speaks it (one token per 80 ms frame), so a waiting
stream is still well ahead of playback whenever the feed averages more than 12.5 tokens a second.

A packet's text is the text whose speech starts in it. The frames tell which tokens the model has read,
which bounds that from above but runs ahead of the speech by the same factor of three; so a token counts
as started once a speaking-rate estimate says its speech begins (clamped to the tokens already read), and
the last packet takes whatever text is left. Only the worker thread calls `step` and `add_text`.
"""

from __future__ import annotations

import bisect
import unicodedata
from dataclasses import dataclass

import torch

from engine.checkpoint import Checkpoint
from engine.prompt import PromptError, TextTokens, Voice, build_prefill
from engine.sampling import SamplingParams


@dataclass
class Packet:
    pcm: bytes  # pcm16 mono 24 kHz
    text: str  # text whose speech starts in this packet
    codes: torch.Tensor  # [16, frames] the packet's codes


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


def to_pcm16(wav: torch.Tensor) -> bytes:
    return (wav.float().clamp(-1, 1) * 32767).round().to(torch.int16).cpu().numpy().tobytes()


class Stream:
    def __init__(self, ckpt: Checkpoint, tokens: TextTokens, voice: Voice, slot: int, params: SamplingParams,
                 seed: int | None, packet_frames: int, max_frames: int, min_frames: int = 2,
                 non_streaming: bool = False) -> None:
        self.ckpt, self.tokens, self.voice = ckpt, tokens, voice
        self.model = ckpt.model
        self.gen = self.model.new_generation(slot, params, seed, min_frames)
        self.packet_frames, self.max_frames = packet_frames, max_frames
        self.non_streaming = non_streaming
        self.text = ""  # everything fed so far (NFC)
        self.final = False
        self.ids: list[int] = []
        self.ends: list[int] = []  # per token, the end of its span in self.text
        self.onsets: list[float] = []  # per token, the estimated frame where its speech starts
        self.costed = 0  # characters counted into self.cost
        self.cost = 0.0
        self.tokenized = 0  # characters of self.text already tokenized
        self.next_token = 0  # the text token the next frame reads
        self.eos_read = False
        self.codes_embed: torch.Tensor | None = None  # codec part of the next talker input
        self.pending: list[torch.Tensor] = []  # codes of frames not yet decoded
        self.spoken_text_end = 0  # characters attributed to emitted packets
        self.codec_state = ckpt.codec.new_state(1)
        self.done = False

    # -- text side (the worker thread passes on what the event loop fed) --
    def add_text(self, fragment: str, final: bool) -> None:
        if not self.text:
            fragment = fragment.lstrip()  # leading blanks would merge with the role's newline token
        self.text += TextTokens.normalize(fragment)
        self.final = self.final or final
        ready = self.tokens.ready_prefix(self.text[self.tokenized:], self.final)
        if ready:
            ids, spans = self.tokens.encode(self.text[self.tokenized:self.tokenized + ready])
            self.ids += ids
            for start, end in spans:
                self.cost += sum(speech_frames(ch) for ch in self.text[self.costed:self.tokenized + start])
                self.costed = max(self.costed, self.tokenized + start)
                self.onsets.append(self.cost)
                self.ends.append(self.tokenized + end)
            self.tokenized += ready
        if self.final and not self.ids:
            raise PromptError("empty text")

    @property
    def runnable(self) -> bool:
        if self.done:
            return False
        if self.non_streaming:
            return self.final
        return self.next_token < len(self.ids) or (self.final and self.codes_embed is not None)

    # -- model side --
    def _next_input(self) -> torch.Tensor:
        cfg = self.model.cfg
        if self.codes_embed is None:
            self.next_token = len(self.ids) if self.non_streaming else 1
            self.eos_read = self.non_streaming  # the non-streaming prefill holds tts_eos already
            return build_prefill(self.model, self.voice, self.tokens.role_ids, self.ids, self.non_streaming)
        if self.next_token < len(self.ids):
            text_id = self.ids[self.next_token]
            self.next_token += 1
        elif not self.eos_read:
            text_id, self.eos_read = cfg.tts_eos, True
        else:
            text_id = cfg.tts_pad
        device = self.codes_embed.device
        return self.codes_embed + self.model.text_embed(torch.tensor([[text_id]], device=device))

    @torch.no_grad()
    def step(self) -> Packet | None:
        """Make one frame; return a packet when one is complete (or the stream ended with frames left)."""
        codes = self.model.decode_step([self.gen], self._next_input())[0]
        if int(codes[0]) == self.model.cfg.codec_eos:
            return self.finish()
        self.pending.append(codes)
        if self.gen.frames >= self.max_frames:
            return self.finish()
        self.codes_embed = self.model.codes_embed(codes[None])
        if len(self.pending) >= self.packet_frames:
            return self._packet(last=False)
        return None

    def finish(self) -> Packet | None:
        self.done = True
        if not self.pending:
            return None
        return self._packet(last=True)

    def _packet(self, last: bool) -> Packet:
        codes = torch.stack(self.pending, dim=1)  # [16, n]
        self.pending = []
        wav = self.ckpt.codec.decode_step(codes[None], self.codec_state)[0]
        # The last packet takes whatever text no packet has claimed (text the model never read included).
        if last:
            end = len(self.text)
        else:
            started = bisect.bisect_left(self.onsets, self.gen.frames, hi=self.next_token)
            end = self.ends[started - 1] if started else 0
        text = self.text[self.spoken_text_end:end]
        self.spoken_text_end = max(self.spoken_text_end, end)
        return Packet(pcm=to_pcm16(wav), text=text, codes=codes)


def synthesize(ckpt: Checkpoint, speaker: str, language: str | None, text: str, params: SamplingParams,
               max_frames: int, seed: int | None = 0, non_streaming: bool = False,
               packet_frames: int = 4, min_frames: int = 2) -> tuple[torch.Tensor, list[Packet]]:
    """A whole utterance on the calling thread (tests, benchmarks): codes [T, 16] and its packets."""
    tokens = TextTokens(ckpt.tokenizer)
    ckpt.model.setup(1, max_frames + 16 + (len(text.encode()) + 8 if non_streaming else 0))
    stream = Stream(ckpt, tokens, Voice.resolve(ckpt.config, speaker, language), 0, params, seed,
                    packet_frames, max_frames, min_frames, non_streaming)
    stream.add_text(text, final=True)
    packets = []
    while not stream.done:
        packet = stream.step()
        if packet is not None:
            packets.append(packet)
    codes = torch.cat([p.codes for p in packets], dim=1).T if packets else torch.zeros(0, 16, dtype=torch.long)
    return codes, packets
