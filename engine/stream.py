"""One utterance between steps: its text feed, its talker state, its audio packets.

A stream advances one frame per `step`. In dual-track mode frame k reads text token k, so a stream whose
next token has not arrived yet is not runnable: it waits for text instead of reading tts_pad, because
tts_pad on the text track means "the text is over" to the model and invites an early EOS (the failure
users report when an LLM feed lags). Once the text is final, the frame after the last token reads tts_eos
and later frames read tts_pad, exactly as the official streaming-text mode does with text known upfront.
Only the worker thread calls `step`; `feed`/`finish` only append under the worker's lock.
"""

from __future__ import annotations

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
        self.tokenized = 0  # characters of self.text already tokenized
        self.next_token = 0  # the text token the next frame reads
        self.eos_read = False
        self.codes_embed: torch.Tensor | None = None  # codec part of the next talker input
        self.pending: list[torch.Tensor] = []  # codes of frames not yet decoded
        self.pending_text_end = 0
        self.spoken_text_end = 0  # characters attributed to emitted packets
        self.codec_state = ckpt.codec.new_state(1)
        self.done = False

    # -- text side (called by the worker, under its lock, with what the event loop fed) --
    def add_text(self, fragment: str, final: bool) -> None:
        if not self.text:
            fragment = fragment.lstrip()  # leading blanks would merge with the role's newline token
        self.text += TextTokens.normalize(fragment)
        self.final = self.final or final
        ready = self.tokens.ready_prefix(self.text[self.tokenized:], self.final)
        if ready:
            ids, spans = self.tokens.encode(self.text[self.tokenized:self.tokenized + ready])
            self.ids += ids
            self.ends += [self.tokenized + end for _, end in spans]
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
            self.pending_text_end = self.ends[self.next_token - 1]
            return build_prefill(self.model, self.voice, self.tokens.role_ids, self.ids, self.non_streaming)
        if self.next_token < len(self.ids):
            text_id = self.ids[self.next_token]
            self.pending_text_end = max(self.pending_text_end, self.ends[self.next_token])
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
        end = len(self.text) if last else self.pending_text_end
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
