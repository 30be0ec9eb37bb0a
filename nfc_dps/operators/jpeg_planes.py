"""A JPEG plane's sampling, the part of :class:`~nfc_dps.operators.jpeg.JpegOperator` between the
image's pixels and the stored 8x8 blocks: the encoder's averaging of subsampled chroma and its
extension of the plane to whole blocks (:class:`Plane`, one :class:`AxisMap` per axis), with their
adjoints and pseudo-inverses, and the blockwise DCT's matrix."""

from __future__ import annotations

import math

import numpy as np
import scipy.fft
import torch
from torch import Tensor

BLOCK = 8


def dct_matrix(n: int = BLOCK) -> np.ndarray:
    """The (n, n) float64 orthonormal DCT-II matrix (rows: frequencies), from scipy.fft."""
    return scipy.fft.dct(np.eye(n), norm="ortho", axis=0)


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


class AxisMap:
    """The encoder's resampling of a plane along one axis: n pixels -> m stored samples, sample j the
    mean of the pixels ``idx[j]`` (``factor`` of them). The first ``k0`` samples average disjoint
    runs of pixels (their pseudo-inverse repeats a sample over its run); the rest, which repeat the
    edge, are a small dense ``tail`` matrix with its pseudo-inverse."""

    def __init__(self, n: int, factor: int, m: int, repeat_low_res_edge: bool) -> None:
        s = factor
        nc = -(-n // s)
        rows = [[min(s * (min(j, nc - 1) if repeat_low_res_edge else j) + t, n - 1) for t in range(s)]
                for j in range(m)]
        self.n, self.s, self.m = n, s, m
        self.idx = torch.tensor(rows, dtype=torch.long)
        self.k0 = max(nc - 2, 0)
        self.p0 = s * self.k0
        tail = np.zeros((m - self.k0, n - self.p0))
        for j in range(self.k0, m):
            for i in rows[j]:
                tail[j - self.k0, i - self.p0] += 1 / s
        pinv = np.linalg.pinv(tail)
        self.tail, self.tail_pinv = torch.from_numpy(tail), torch.from_numpy(pinv)
        self.tail_range = torch.from_numpy(tail @ pinv)
        #: the stored samples are not free (some repeat others): projections need the range
        self.coupled = not np.allclose(tail @ pinv, np.eye(m - self.k0), atol=1e-9)
        self.norm2 = max(1 / s if self.k0 else 0.0, float(np.linalg.norm(tail, 2)) ** 2)
        self._on: dict[tuple, tuple[Tensor, ...]] = {}

    def _mats(self, like: Tensor) -> tuple[Tensor, ...]:
        key = (like.device, like.dtype)
        if key not in self._on:
            self._on[key] = (self.idx.to(like.device), *(t.to(device=like.device, dtype=like.dtype)
                                                         for t in (self.tail_pinv, self.tail_range)))
        return self._on[key]

    def forward(self, x: Tensor) -> Tensor:
        """(..., n) -> (..., m) along the last axis."""
        idx = self._mats(x)[0]
        return x[..., idx.flatten()].unflatten(-1, (self.m, self.s)).mean(-1)

    def adjoint(self, y: Tensor) -> Tensor:
        """(..., m) -> (..., n) along the last axis."""
        idx = self._mats(y)[0]
        out = y.new_zeros((*y.shape[:-1], self.n))
        spread = (y / self.s).unsqueeze(-1).expand(*y.shape, self.s).flatten(-2)
        return out.index_add_(-1, idx.flatten(), spread)

    def pinv(self, y: Tensor) -> Tensor:
        """The pseudo-inverse, (..., m) -> (..., n)."""
        pinv = self._mats(y)[1]
        head = y[..., : self.k0].repeat_interleave(self.s, -1)
        return torch.cat([head, y[..., self.k0:] @ pinv.T], -1)

    def range_projection(self, y: Tensor, start: int = 0) -> Tensor:
        """The orthogonal projection onto the samples the map can give, of samples ``start`` .. m - 1
        (..., m - start), ``start`` <= k0 (the samples before k0 are free)."""
        if not self.coupled:
            return y
        rng, k = self._mats(y)[2], self.k0 - start
        return torch.cat([y[..., :k], y[..., k:] @ rng.T], -1)


def _on_rows(fn, x: Tensor) -> Tensor:
    return fn(x.transpose(-1, -2)).transpose(-1, -2)


class Plane:
    """One stored plane: its axis maps, its steps and weights tiled over its (mv, mh) samples, and its
    factors (sv, sh) back to the measurement grid."""

    def __init__(self, image_hw: tuple[int, int], factors: tuple[int, int], table: Tensor, q_min: float,
                 level_shift: float) -> None:
        (h, w), (sv, sh) = image_hw, factors
        self.factors = (sv, sh)
        mv, mh = BLOCK * _blocks(-(-h // sv)), BLOCK * _blocks(-(-w // sh))
        self.shape = (mv, mh)
        self.rows = AxisMap(h, sv, mv, repeat_low_res_edge=True)
        self.cols = AxisMap(w, sh, mh, repeat_low_res_edge=False)
        self.step = table.tile(mv // BLOCK, mh // BLOCK)  # q per coefficient, [0, 1] units
        self.weight = q_min / self.step
        offset = torch.zeros(BLOCK, BLOCK, dtype=torch.float64)
        offset[0, 0] = BLOCK * level_shift  # the DC of a constant plane of level_shift
        self.offset = offset.tile(mv // BLOCK, mh // BLOCK)
        self.coupled = self.rows.coupled or self.cols.coupled

    def sample(self, u: Tensor) -> Tensor:
        """D: (..., H, W) plane -> (..., mv, mh) stored samples."""
        return self.cols.forward(_on_rows(self.rows.forward, u))

    def sample_adjoint(self, v: Tensor) -> Tensor:
        return _on_rows(self.rows.adjoint, self.cols.adjoint(v))

    def sample_pinv(self, v: Tensor) -> Tensor:
        return _on_rows(self.rows.pinv, self.cols.pinv(v))

    def edge_strips(self) -> tuple[int, int]:
        """(r0, c0): the samples whose blocks the edge extension ties together are rows r0.. (every
        column) and columns c0.. (rows above r0); (mv, mh) when none are."""
        mv, mh = self.shape
        return (BLOCK * (self.rows.k0 // BLOCK) if self.rows.coupled else mv,
                BLOCK * (self.cols.k0 // BLOCK) if self.cols.coupled else mh)

    def strips_range(self, bottom: Tensor, right: Tensor) -> tuple[Tensor, Tensor]:
        """The projection onto the samples D can give, on the edge strips v[r0:, :], v[:r0, c0:]."""
        r0, c0 = self.edge_strips()
        bottom = _on_rows(lambda t: self.rows.range_projection(t, r0), self.cols.range_projection(bottom))
        return bottom, self.cols.range_projection(right, c0)

    def upsample(self, v: Tensor) -> Tensor:
        """S_orth^T: (..., mv, mh) -> (..., mv sv, mh sh), an isometry."""
        sv, sh = self.factors
        if (sv, sh) == (1, 1):
            return v
        return v.repeat_interleave(sv, -2).repeat_interleave(sh, -1) / math.sqrt(sv * sh)

    def downsample(self, y: Tensor) -> Tensor:
        """S_orth, the adjoint of :meth:`upsample`."""
        sv, sh = self.factors
        if (sv, sh) == (1, 1):
            return y
        mv, mh = self.shape
        return y.unflatten(-1, (mh, sh)).sum(-1).unflatten(-2, (mv, sv)).sum(-2) / math.sqrt(sv * sh)
