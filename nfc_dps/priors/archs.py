"""Network designs for trained priors: diffusers ``UNet2DModel`` configurations, by name.

* ``"unet"`` (the default prior's design): ResNet blocks with GroupNorm and a self-attention
  layer in the middle block. GroupNorm and attention take statistics over the whole input, so
  the output at a pixel depends on the image's size and content far away: it is applied in
  tiles of its training size (:class:`~nfc_dps.priors.base.TiledPrior`).
* ``"unet-pixelnorm"``: the same UNet without attention, every GroupNorm replaced by
  :class:`ChannelNorm`, a LayerNorm over the channels of each pixel (as in ConvNeXt, Liu et al.
  2022). No statistic spans the image, so the network is translation-equivariant (up to its
  down-sampling grid) and a pixel's output depends only on its receptive field: the same on a
  crop and on a larger image, away from the borders. It runs on whole images, no tiles, in
  channels_last layout. Per-pixel normalisation in place of GroupNorm is also what EDM2 (Karras
  et al. 2024, "Analyzing and improving the training dynamics of diffusion models") uses.

The weights' names and shapes are those of ``UNet2DModel`` in both designs (a ChannelNorm has
the GroupNorm's ``weight`` and ``bias``), so ``save_pretrained`` / ``from_pretrained`` store and
read them; ``nfc_dps_prior.json``'s ``"arch"`` key says which design to rebuild.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ARCHS = ("unet", "unet-pixelnorm")
DEFAULT_ARCH = "unet"
#: the default prior's widths (48^2 -> 24^2 -> 12^2 for a 48^2 crop) and ResNet layers per block
DEFAULT_WIDTHS = (48, 96, 192)
DEFAULT_LAYERS = 1


class ChannelNorm(nn.Module):
    """Per-pixel LayerNorm over channels: (B, C, H, W) -> same, with a (C,) affine weight and bias.

    Statistics in float32 (also under bfloat16 autocast); the output has x's dtype. Fastest on
    channels_last tensors (the channel vector of a pixel is contiguous), which is how
    :func:`build_unet` and the loader run this design.
    """

    def __init__(self, num_channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.num_channels, self.eps = num_channels, eps
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x: Tensor) -> Tensor:
        y = F.layer_norm(x.permute(0, 2, 3, 1).float(), (self.num_channels,), self.weight.float(), self.bias.float(),
                         self.eps)
        return y.permute(0, 3, 1, 2).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}"


def check_arch(arch: str) -> str:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    return arch


def unet_config(arch: str = DEFAULT_ARCH, channels: int = 3, widths: Sequence[int] = DEFAULT_WIDTHS,
                layers: int = DEFAULT_LAYERS, sample_size: int = 48) -> dict:
    """``UNet2DModel`` keyword arguments of a design; widths = channels per resolution level.

    GroupNorm uses 16 groups when every width is a multiple of 16 (the default prior), else the
    widths' greatest common divisor (tiny test networks).
    """
    check_arch(arch)
    widths = tuple(int(w) for w in widths)
    if len(widths) < 2 or min(widths) < 1 or layers < 1 or channels not in (1, 3):
        raise ValueError(f"bad network size: widths {widths} (>= 2 levels), layers {layers} (>= 1), "
                         f"channels {channels} (1 or 3)")
    groups = 16 if all(w % 16 == 0 for w in widths) else math.gcd(*widths)
    return dict(
        sample_size=int(sample_size), in_channels=channels, out_channels=channels, block_out_channels=widths,
        down_block_types=("DownBlock2D",) * len(widths), up_block_types=("UpBlock2D",) * len(widths),
        layers_per_block=int(layers), norm_num_groups=groups, add_attention=arch == "unet",
    )


def to_channel_norm(net: nn.Module) -> nn.Module:
    """Replace every ``nn.GroupNorm`` in ``net`` (in place) by a :class:`ChannelNorm` with its weights."""
    for name, mod in list(net.named_modules()):
        if isinstance(mod, nn.GroupNorm):
            parent = net.get_submodule(name.rpartition(".")[0]) if "." in name else net
            new = ChannelNorm(mod.num_channels, mod.eps).to(device=mod.weight.device, dtype=mod.weight.dtype)
            with torch.no_grad():
                new.weight.copy_(mod.weight)
                new.bias.copy_(mod.bias)
            setattr(parent, name.rpartition(".")[2], new)
    return net


def adapt_loaded_unet(unet: nn.Module, arch: str, where: str = "network") -> nn.Module:
    """Turn a ``UNet2DModel`` built from its config.json into design ``arch`` (a ValueError naming
    ``where`` when the config cannot be that design)."""
    check_arch(arch)
    if arch == "unet-pixelnorm":
        if unet.config.add_attention:
            raise ValueError(f"{where}: arch 'unet-pixelnorm' needs add_attention false in the UNet config "
                             f"(attention spans the whole image)")
        to_channel_norm(unet)
        unet.to(memory_format=torch.channels_last)
    return unet


def unet2d_model_class() -> type:
    """diffusers' ``UNet2DModel``, imported on first use. A torchvision built for another torch breaks
    diffusers' import (``operator torchvision::nms does not exist``, e.g. after installing what
    deepinv asks for): an ImportError then names the cause and the fix."""
    try:
        from diffusers import UNet2DModel
    except (RuntimeError, ImportError) as e:
        if "torchvision" not in str(e):
            raise
        import importlib.metadata as md

        try:
            vision = md.version("torchvision")
        except md.PackageNotFoundError:
            vision = "?"
        raise ImportError(
            f"diffusers could not be imported because the installed torchvision {vision} does not match torch "
            f"{torch.__version__} ({e}). nfc_dps does not need torchvision: uninstall it (pip uninstall "
            f"torchvision), or install the torchvision built for this torch") from e
    return UNet2DModel


def build_unet(arch: str = DEFAULT_ARCH, channels: int = 3, widths: Sequence[int] = DEFAULT_WIDTHS,
               layers: int = DEFAULT_LAYERS, sample_size: int = 48) -> nn.Module:
    """A freshly initialised network of design ``arch`` (see the module docstring)."""
    cfg = unet_config(arch, channels, widths, layers, sample_size)
    return adapt_loaded_unet(unet2d_model_class()(**cfg), arch)


def size_independent(arch: str) -> bool:
    """Whether the design's output at a pixel depends only on its receptive field (no tiling needed)."""
    return check_arch(arch) == "unet-pixelnorm"
