"""Test helper: a minimal, independent re-implementation of the OpenAI guided-diffusion (ADM) UNet.

Written from the architecture description (Dhariwal & Nichol 2021, "Diffusion Models Beat GANs",
and the layout of guided-diffusion's ``unet.py``), not copied. Only the unconditional 2D model
with the options the converter supports is covered. Module and parameter names reproduce
guided-diffusion's state-dict layout exactly (``time_embed.*``, ``input_blocks.*``,
``middle_block.*``, ``output_blocks.*``, ``out.*``), so a state dict of this module *is* an ADM
checkpoint as far as key names and shapes go.

Numerics follow ADM: the sinusoidal timestep embedding is computed in float32 (cat[cos, sin]),
GroupNorm and the attention softmax are upcast to (at least) float32. Unlike ADM, a float64
model keeps float64 there (ADM would downcast to float32), so a float64 comparison is exact.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """(B,) timesteps -> (B, dim) embedding [cos(t f_i), sin(t f_i)], f_i = max_period^(-i/half)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class GroupNorm32(nn.GroupNorm):
    """GroupNorm(32, C) evaluated in at least float32 (ADM upcasts half precision)."""

    def __init__(self, channels: int) -> None:
        super().__init__(32, channels)

    def forward(self, x: Tensor) -> Tensor:
        work = torch.promote_types(x.dtype, torch.float32)
        w, b = self.weight.to(work), self.bias.to(work)
        return F.group_norm(x.to(work), self.num_groups, w, b, self.eps).to(x.dtype)


class TimestepSequential(nn.Sequential):
    """Sequential whose ResBlocks also receive the embedding."""

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:  # type: ignore[override]
        for layer in self:
            x = layer(x, emb) if isinstance(layer, ResBlock) else layer(x)
        return x


class ResBlock(nn.Module):
    """ADM residual block: GN-SiLU-conv, (resample), emb scale-shift on GN, SiLU, conv; skip 1x1 if C changes."""

    def __init__(self, ch: int, emb_ch: int, out_ch: int, scale_shift: bool = True, up: bool = False, down: bool = False) -> None:
        super().__init__()
        self.up, self.down, self.scale_shift = up, down, scale_shift
        self.in_layers = nn.Sequential(GroupNorm32(ch), nn.SiLU(), nn.Conv2d(ch, out_ch, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_ch, 2 * out_ch if scale_shift else out_ch))
        self.out_layers = nn.Sequential(GroupNorm32(out_ch), nn.SiLU(), nn.Dropout(0.0), nn.Conv2d(out_ch, out_ch, 3, padding=1))
        self.skip_connection = nn.Identity() if out_ch == ch else nn.Conv2d(ch, out_ch, 1)

    def _resample(self, x: Tensor) -> Tensor:
        if self.up:
            return F.interpolate(x, scale_factor=2, mode="nearest")
        if self.down:
            return F.avg_pool2d(x, kernel_size=2, stride=2)
        return x

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        h = self.in_layers[1](self.in_layers[0](x))
        h, x = self._resample(h), self._resample(x)
        h = self.in_layers[2](h)
        e = self.emb_layers(emb).to(h.dtype)[:, :, None, None]
        if self.scale_shift:
            scale, shift = e.chunk(2, dim=1)
            h = self.out_layers[0](h) * (1 + scale) + shift
            for layer in self.out_layers[1:]:
                h = layer(h)
        else:
            h = self.out_layers(h + e)
        return self.skip_connection(x) + h


class AttentionBlock(nn.Module):
    """ADM self-attention over pixels: GN, conv1d qkv, multi-head attention, conv1d proj_out, residual.

    ``legacy=True`` is QKVAttentionLegacy: the 3C qkv channels are laid out head-first,
    (heads, [q|k|v], head_ch). ``legacy=False`` (QKVAttention) is [q|k|v]-first, (3, heads, head_ch).
    """

    def __init__(self, ch: int, head_ch: int, legacy: bool = True) -> None:
        super().__init__()
        assert ch % head_ch == 0
        self.heads, self.legacy = ch // head_ch, legacy
        self.norm = GroupNorm32(ch)
        self.qkv = nn.Conv1d(ch, 3 * ch, 1)
        self.proj_out = nn.Conv1d(ch, ch, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, hh, ww = x.shape
        flat = x.reshape(b, c, hh * ww)
        qkv = self.qkv(self.norm(flat))
        n, hc = self.heads, c // self.heads
        if self.legacy:
            q, k, v = qkv.reshape(b * n, 3 * hc, -1).split(hc, dim=1)
        else:
            q, k, v = (z.reshape(b * n, hc, -1) for z in qkv.chunk(3, dim=1))
        scale = hc ** -0.25
        logits = torch.einsum("nct,ncs->nts", q * scale, k * scale)
        work = torch.promote_types(logits.dtype, torch.float32)
        weights = torch.softmax(logits.to(work), dim=-1).to(logits.dtype)
        a = torch.einsum("nts,ncs->nct", weights, v).reshape(b, c, -1)
        return (flat + self.proj_out(a)).reshape(b, c, hh, ww)


class ADMUNet(nn.Module):
    """Unconditional ADM UNet (resblock_updown, scale-shift norm, attention at the given downsample rates).

    Args:
        image_size: training resolution; ``attention_resolutions`` are resolutions (e.g. 16 means
            attention where the feature map is 16x16 for image_size=256, i.e. downsample rate 16).
        channel_mult: per-level channel multipliers; the number of levels is len(channel_mult).
        learn_sigma: output 2*in_channels channels (epsilon, then the variance interpolation).
    """

    def __init__(
        self,
        image_size: int,
        num_channels: int,
        num_res_blocks: int,
        channel_mult: tuple[int, ...],
        attention_resolutions: tuple[int, ...],
        num_head_channels: int,
        learn_sigma: bool = True,
        in_channels: int = 3,
        use_scale_shift_norm: bool = True,
        use_new_attention_order: bool = False,
    ) -> None:
        super().__init__()
        mc = num_channels
        emb_ch = 4 * mc
        rates = {image_size // r for r in attention_resolutions}
        legacy = not use_new_attention_order
        ss = use_scale_shift_norm
        self.model_channels = mc
        self.time_embed = nn.Sequential(nn.Linear(mc, emb_ch), nn.SiLU(), nn.Linear(emb_ch, emb_ch))

        ch = channel_mult[0] * mc
        self.input_blocks = nn.ModuleList([TimestepSequential(nn.Conv2d(in_channels, ch, 3, padding=1))])
        skip_chs = [ch]
        ds = 1
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers: list[nn.Module] = [ResBlock(ch, emb_ch, mult * mc, ss)]
                ch = mult * mc
                if ds in rates:
                    layers.append(AttentionBlock(ch, num_head_channels, legacy))
                self.input_blocks.append(TimestepSequential(*layers))
                skip_chs.append(ch)
            if level != len(channel_mult) - 1:
                self.input_blocks.append(TimestepSequential(ResBlock(ch, emb_ch, ch, ss, down=True)))
                skip_chs.append(ch)
                ds *= 2

        self.middle_block = TimestepSequential(
            ResBlock(ch, emb_ch, ch, ss), AttentionBlock(ch, num_head_channels, legacy), ResBlock(ch, emb_ch, ch, ss)
        )

        self.output_blocks = nn.ModuleList()
        for level, mult in reversed(list(enumerate(channel_mult))):
            for i in range(num_res_blocks + 1):
                layers = [ResBlock(ch + skip_chs.pop(), emb_ch, mult * mc, ss)]
                ch = mult * mc
                if ds in rates:
                    layers.append(AttentionBlock(ch, num_head_channels, legacy))
                if level and i == num_res_blocks:
                    layers.append(ResBlock(ch, emb_ch, ch, ss, up=True))
                    ds //= 2
                self.output_blocks.append(TimestepSequential(*layers))

        out_ch = 2 * in_channels if learn_sigma else in_channels
        self.out = nn.Sequential(GroupNorm32(ch), nn.SiLU(), nn.Conv2d(ch, out_ch, 3, padding=1))

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        t = torch.as_tensor(t, device=x.device)
        if t.ndim == 0:
            t = t.expand(x.shape[0])
        emb = self.time_embed(timestep_embedding(t, self.model_channels).to(x.dtype))
        h, hs = x, []
        for block in self.input_blocks:
            h = block(h, emb)
            hs.append(h)
        h = self.middle_block(h, emb)
        for block in self.output_blocks:
            h = block(torch.cat([h, hs.pop()], dim=1), emb)
        return self.out(h)


def randomize_(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Overwrite every parameter (including ADM's zero-initialised convs) with random values.

    Weights ~ N(0, 1/fan_in) (keeps activations O(1)); GroupNorm scales ~ 1 + 0.2 N(0,1);
    biases and GroupNorm shifts ~ 0.1 N(0,1).
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(z / math.sqrt(fan_in))
            elif name.endswith("weight"):  # GroupNorm scale
                p.copy_(1.0 + 0.2 * z)
            else:
                p.copy_(0.1 * z)
    return model
