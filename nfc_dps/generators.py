"""Seeded noise per image: the random sources of a batch (:data:`Generators`) and standard normal
draws from them (:func:`randn_per_image`), so that a result depends neither on the batch's size
nor on its composition. Everything that draws noise (noise models, operators, samplers) builds on
this module."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

#: the random sources of a batch: one generator, one per image (or per chain), or None (torch's global one)
Generators = torch.Generator | Sequence[torch.Generator] | None


def randn_per_image(shape: Sequence[int], generators: Generators,
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Tensor:
    """Standard normal noise of ``shape`` (B, ...), image b drawn from ``generators[b]``.

    One generator per image makes results independent of batch size and composition. A single
    generator is used for the whole batch; None uses torch's global RNG.
    """
    if generators is None or isinstance(generators, torch.Generator):
        gen_device = generators.device if isinstance(generators, torch.Generator) else device
        return torch.randn(tuple(shape), generator=generators, dtype=dtype, device=gen_device).to(device)
    if len(generators) != shape[0]:
        raise ValueError(f"got {len(generators)} generators for a batch of {shape[0]}")
    return torch.stack(
        [torch.randn(tuple(shape[1:]), generator=g, dtype=dtype, device=g.device) for g in generators]
    ).to(device)
