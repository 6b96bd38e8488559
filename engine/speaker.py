"""The Base checkpoint's speaker encoder: a 24 kHz waveform -> one x-vector, the voice a clone speaks in.

An ECAPA-TDNN (Desplanques et al. 2020) over a log-mel spectrogram, as the official
``Qwen3TTSSpeakerEncoder`` and ``extract_speaker_embedding`` compute it (qwen-tts 0.1.1,
qwen_tts/core/models/modeling_qwen3_tts.py), written against the same weights (prefix ``speaker_encoder.``):

    log-mel [T, 128] -> TDNN -> 3 SE-Res2Net blocks -> multi-layer aggregation (TDNN over the blocks'
    outputs) -> attentive statistics pooling (mean and std over time) -> 1x1 conv -> x-vector [enc_dim]

Every convolution pads "same" by reflection and has a ReLU after it (a TDNN block). The x-vector has the
talker's width: the prompt puts it where a CustomVoice prompt puts a speaker's codec embedding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.audio_utils import mel_filter_bank

from engine.api import SAMPLE_RATE

N_FFT, HOP, WINDOW, MELS = 1024, 256, 1024, 128


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """``speaker_encoder_config`` of config.json (defaults: the official class's)."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: list[int] = field(default_factory=lambda: [512, 512, 512, 512, 1536])
    enc_kernel_sizes: list[int] = field(default_factory=lambda: [5, 3, 3, 3, 1])
    enc_dilations: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 1])
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = SAMPLE_RATE

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeakerEncoderConfig:
        cfg = cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        lengths = {len(cfg.enc_channels), len(cfg.enc_kernel_sizes), len(cfg.enc_dilations)}
        if len(lengths) != 1 or len(cfg.enc_channels) < 3:
            raise ValueError("speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations must have "
                             "the same length (at least 3)")
        if cfg.mel_dim != MELS or cfg.sample_rate != SAMPLE_RATE:
            raise ValueError(f"speaker_encoder_config: the official front end makes {MELS} mels at {SAMPLE_RATE} Hz")
        return cfg


class TDNN(nn.Module):
    """A 1-D convolution with reflected "same" padding, then ReLU."""

    def __init__(self, cin: int, cout: int, kernel_size: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel_size, dilation=dilation, padding="same", padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    """The channels in `scale` groups; group i > 0 goes through its own TDNN after the previous group's
    output is added to it (group 0 passes through), widening the receptive field group by group."""

    def __init__(self, channels: int, scale: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(channels // scale, channels // scale, kernel_size, dilation)
                                    for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out = [parts[0]]
        for i, block in enumerate(self.blocks, start=1):
            out.append(block(parts[i] if i == 1 else parts[i] + out[-1]))
        return torch.cat(out, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(channels, se_channels, 1)
        self.conv2 = nn.Conv1d(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNN(cin, cout, 1)
        self.res2net_block = Res2Net(cout, scale, kernel_size, dilation)
        self.tdnn2 = TDNN(cout, cout, 1)
        self.se_block = SqueezeExcitation(cout, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatisticsPooling(nn.Module):
    """Mean and standard deviation over time, weighted per channel by an attention over time that sees each
    frame next to the utterance's plain mean and std."""

    eps = 1e-12

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1)

    def statistics(self, x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (weights * x).sum(2)
        std = ((weights * (x - mean[..., None]).pow(2)).sum(2).clamp(self.eps)).sqrt()
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        mean, std = self.statistics(x, torch.full_like(x[:, :1], 1 / frames))
        context = torch.cat([x, mean[..., None].expand_as(x), std[..., None].expand_as(x)], dim=1)
        weights = self.conv(torch.tanh(self.tdnn(context))).softmax(dim=2)
        mean, std = self.statistics(x, weights)
        return torch.cat([mean, std], dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        self.cfg = cfg
        self.blocks = nn.ModuleList([TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])])
        self.blocks.extend(SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i])
                           for i in range(1, len(ch) - 1))
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatisticsPooling(ch[-1], cfg.enc_attention_channels)
        self.fc = nn.Conv1d(ch[-1] * 2, cfg.enc_dim, 1)

    @staticmethod
    def mel_spectrogram(wav: torch.Tensor) -> torch.Tensor:
        """[T] float32 24 kHz -> log-mel [frames, 128] (float32): a Hann-window STFT of the reflection-padded
        signal, magnitudes, Slaney mel filters (librosa's, as the official mel_spectrogram uses), log of at
        least 1e-5."""
        mel = mel_filter_bank(num_frequency_bins=N_FFT // 2 + 1, num_mel_filters=MELS, min_frequency=0,
                              max_frequency=SAMPLE_RATE / 2, sampling_rate=SAMPLE_RATE, norm="slaney",
                              mel_scale="slaney")
        pad = (N_FFT - HOP) // 2
        wav = F.pad(wav[None, None], (pad, pad), mode="reflect")[0]
        spec = torch.stft(wav, N_FFT, hop_length=HOP, win_length=WINDOW, window=torch.hann_window(WINDOW).to(wav),
                          center=False, normalized=False, onesided=True, return_complex=True)
        magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
        return torch.log(torch.clamp(torch.from_numpy(mel.T).float().to(wav) @ magnitude, min=1e-5))[0].T

    @torch.no_grad()
    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """A 24 kHz waveform [T] -> its x-vector [enc_dim], float32 (the convolutions run in the weights'
        dtype)."""
        weight = self.fc.weight
        x = self.mel_spectrogram(wav.to(device=weight.device, dtype=torch.float32)).T[None].to(weight.dtype)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x))[0, :, 0].float()
