"""JPEG compression as a linear measurement whose noise is the quantisation error.

A JPEG file stores, per 8x8 block, the orthonormal 2-D DCT-II of each of its planes divided by the
plane's quantisation table q and rounded to an integer k. The planes are the JFIF YCbCr planes of the
image (luma at full resolution; chroma averaged over 2x2 pixels for 4:2:0, 2x1 for 4:2:2, not at all
for 4:4:4), extended past the image to whole blocks as libjpeg's encoder extends them: the last pixel
row / column repeated at full resolution, except below a vertically subsampled chroma plane, where
its last averaged row is repeated. Gray JPEGs have one plane, the luma table's.

:class:`JpegOperator` poses this as y = A x + n with A linear and n white Gaussian (the rounding
error, uniform on +-q/2, relaxed to a Gaussian of std q / sqrt(12)), on pixel-shaped planes:

    A x = T^T diag(q_min / q) B D C x        per plane, stacked as (B, 3, Hp, Wp)

C the linear part of JFIF's RGB -> YCbCr (no offsets: operators are linear), D the encoder's
averaging and extension to whole blocks, B the blockwise DCT, q the file's steps in [0, 1] pixel
units (table / 255), q_min the smallest of them, and T^T the isometry that takes a plane's
coefficients back to a full-size pixel grid (inverse DCT, then for subsampled chroma nearest
upsampling divided by sqrt(2) or 2). Each stored coefficient is then observed with noise std
q / sqrt(12) in its own units, and y with white noise of std q_min / sqrt(12)
(:attr:`JpegOperator.sigma_y`). The file's integers k give the measurement
(:meth:`~JpegOperator.measurement`), and the classical data step is the projection onto their
quantisation cells (:meth:`~JpegOperator.project`). Reading a file: :mod:`nfc_dps.io.jpeg`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from ..io.jpeg import RGB_TO_YCBCR, SUBSAMPLINGS, JpegFile, decoded_planes, read_jpeg
from ..noise import GaussianNoise
from .base import LinearOperator, check_image
from .jpeg_planes import BLOCK, Plane, dct_matrix

__all__ = ["JpegOperator", "JpegMeasurement", "jpeg_measurement", "LEVEL_SHIFT", "dct_matrix"]

#: the level shift JPEG subtracts from the luma plane before its DCT, [0, 1] units
LEVEL_SHIFT = 128 / 255


class JpegOperator(LinearOperator):
    """JPEG compression of (B, 3, H, W) RGB (or, ``channels=1``, each channel of a gray image as a
    luma plane) in [0, 1]: A x (B, C, Hp, Wp), Hp and Wp the image's size rounded up to whole MCUs
    (8 px, or 16 along a subsampled chroma axis). See the module docstring for A.

    Args:
        tables: the quantisation tables in the file's 0-255 units, natural (row-major) order: one
            (8, 8) table per plane (3 for colour: Y, Cb, Cr; 2: luma and a chroma table for both;
            1 for gray), any positive numbers.
        image_size: (H, W) of the image (the operator extends it to whole blocks as the encoder does).
        subsampling: "4:2:0", "4:2:2" or "4:4:4" (colour only).
        channels: 3 (RGB through JFIF's YCbCr) or 1 (gray: every channel a luma plane).

    ``sigma_y`` (q_min / sqrt(12), [0, 1] units) is the measurement's noise std. ``prox`` is the base
    class's conjugate gradients; ``A_pinv`` is closed form (a generalised inverse: A A^+ A = A).
    """

    name = "jpeg"
    family = "other"
    #: the measurement is frequency-weighted YCbCr, not an image: its noise level is not read from it
    image_measurement = False

    def __init__(self, tables: Any, image_size: Sequence[int], subsampling: str = "4:2:0", channels: int = 3) -> None:
        super().__init__()
        if channels not in (1, 3):
            raise ValueError(f"channels must be 3 (RGB) or 1 (gray), got {channels!r}")
        if subsampling not in SUBSAMPLINGS:
            raise ValueError(f"subsampling must be one of {tuple(SUBSAMPLINGS)}, got {subsampling!r}")
        t = torch.as_tensor(np.asarray(tables, dtype=np.float64))
        if t.ndim == 2:
            t = t[None]
        if t.ndim != 3 or t.shape[1:] != (BLOCK, BLOCK) or not (1 <= t.shape[0] <= 3):
            raise ValueError(f"tables must be one to three (8, 8) tables, got shape {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
            raise ValueError("quantisation tables must hold finite steps > 0")
        planes = 1 if channels == 1 else 3
        if channels == 1:
            t = t[:1]
        elif t.shape[0] == 1:
            raise ValueError("a colour JPEG needs a luma and a chroma table (or one per plane), got one table")
        elif t.shape[0] == 2:
            t = torch.cat([t, t[1:]])
        h, w = (int(v) for v in image_size)
        if h < 1 or w < 1:
            raise ValueError(f"image_size must be positive, got {tuple(image_size)}")
        self.h, self.w = h, w
        self.channels = channels
        self.subsampling = subsampling if channels == 3 else "4:4:4"
        self.tables = t  # (planes, 8, 8), 0-255 units
        self.image_channels = 3 if channels == 3 else None
        steps = t / 255.0
        self.q_min = float(steps.min())
        sv, sh = SUBSAMPLINGS[self.subsampling]
        factors = [(1, 1)] + [(sv, sh)] * (planes - 1)
        self.mcu = (BLOCK * sv, BLOCK * sh)
        self.padded_hw = (self.mcu[0] * -(-h // self.mcu[0]), self.mcu[1] * -(-w // self.mcu[1]))
        self.planes = [Plane((h, w), f, steps[p], self.q_min, LEVEL_SHIFT if p == 0 else 0.0)
                       for p, f in enumerate(factors)]
        rgb = torch.tensor(RGB_TO_YCBCR, dtype=torch.float64)
        self._color = rgb
        self._color_inv = torch.linalg.inv(rgb)
        self._dct = torch.from_numpy(dct_matrix())
        self._cache: dict[tuple, dict[str, Tensor]] = {}
        color_norm2 = float(torch.linalg.matrix_norm(rgb, 2)) ** 2 if channels == 3 else 1.0
        self._norm2 = color_norm2 * max(p.rows.norm2 * p.cols.norm2 for p in self.planes)

    # ------------------------------------------------------------------ declarations
    @property
    def sigma_y(self) -> float:
        """The measurement's noise std, q_min / sqrt(12), [0, 1] pixel units."""
        return self.q_min / math.sqrt(12)

    def measurement_noise(self) -> Any:
        """The file's own noise: Gaussian of std :attr:`sigma_y` (the quantisation error, relaxed)."""
        return GaussianNoise(self.sigma_y)

    def consistent(self, x: Tensor, y: Tensor) -> Tensor:
        """``x`` projected onto the quantisation cells of the integers ``y`` stores
        (:meth:`project`, in float64), in x's dtype."""
        return self.project(x.double(), y.double()).to(x.dtype)

    def norm_bound(self) -> float:
        """A bound on ||A||^2: ||C||^2 times the largest ||D||^2 of a plane (1 / (sv sh) inside
        the image, more where the encoder's edge extension repeats pixels)."""
        return self._norm2

    def extra_repr(self) -> str:
        return f"image_size={(self.h, self.w)}, subsampling={self.subsampling!r}, channels={self.channels}"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "image_size": [self.h, self.w], "subsampling": self.subsampling,
                "channels": self.channels, "tables": self.tables.round().int().tolist(),
                "q_min": self.q_min, "sigma_y": self.sigma_y}

    # ------------------------------------------------------------------ shapes
    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        if len(image_shape) != 4 or tuple(image_shape[-2:]) != (self.h, self.w):
            raise ValueError(f"this JPEG operator takes (B, C, {self.h}, {self.w}) images, got {tuple(image_shape)}")
        if self.channels == 3 and image_shape[1] != 3:
            raise ValueError(f"a colour JPEG operator takes RGB images (B, 3, H, W), got {tuple(image_shape)}")
        return (image_shape[0], image_shape[1], *self.padded_hw)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        if len(measurement_shape) != 4 or tuple(measurement_shape[-2:]) != self.padded_hw:
            raise ValueError(f"a measurement of this JPEG operator is (B, C, {self.padded_hw[0]}, "
                             f"{self.padded_hw[1]}), got {tuple(measurement_shape)}")
        if self.channels == 3 and measurement_shape[1] != 3:
            raise ValueError(f"a colour JPEG measurement has 3 planes, got {tuple(measurement_shape)}")
        return (measurement_shape[0], measurement_shape[1], self.h, self.w)

    # ------------------------------------------------------------------ transforms
    def _consts(self, like: Tensor) -> dict[str, Tensor]:
        key = (like.device, like.dtype)
        if key not in self._cache:
            def cast(t: Tensor) -> Tensor:
                return t.to(device=like.device, dtype=like.dtype)
            self._cache[key] = {"dct": cast(self._dct), "color": cast(self._color), "color_inv": cast(self._color_inv),
                                **{f"{name}{p}": cast(getattr(plane, name)) for p, plane in enumerate(self.planes)
                                   for name in ("step", "weight", "offset")}}
        return self._cache[key]

    def _dct2(self, v: Tensor, inverse: bool = False) -> Tensor:
        """Blockwise orthonormal DCT-II of (..., mv, mh) (coefficients in the blocks' places)."""
        d = self._consts(v)["dct"]
        blocks = v.unflatten(-1, (-1, BLOCK)).unflatten(-3, (-1, BLOCK))  # (..., bv, 8, bh, 8)
        rows = torch.einsum("xa,...pxqy->...paqy" if inverse else "ax,...pxqy->...paqy", d, blocks)
        return torch.einsum("yb,...paqy->...paqb" if inverse else "by,...paqy->...paqb", d, rows).flatten(-2).flatten(-3, -2)

    def _to_planes(self, x: Tensor) -> list[Tensor]:
        """x (B, C, H, W) -> the planes at full resolution: [Y, Cb, Cr] (B, H, W) each, or for gray
        one (B, C, H, W) plane."""
        if self.channels == 1:
            return [x]
        u = torch.einsum("pc,bchw->bphw", self._consts(x)["color"], x)
        return list(u.unbind(1))

    def _from_planes(self, planes: list[Tensor], inverse: bool) -> Tensor:
        """The image of full-resolution planes: C^-1 (``inverse``) or C^T applied to them."""
        if self.channels == 1:
            return planes[0]
        c = self._consts(planes[0])
        u = torch.stack(planes, 1)
        return torch.einsum("cp,bphw->bchw", c["color_inv"], u) if inverse else torch.einsum("pc,bphw->bchw", c["color"], u)

    def _stack(self, planes: list[Tensor]) -> Tensor:
        """Measurement-grid planes (..., h_p, w_p) -> (B, C, Hp, Wp), zero past a plane's blocks."""
        hp, wp = self.padded_hw
        full = [torch.nn.functional.pad(y, (0, wp - y.shape[-1], 0, hp - y.shape[-2])) for y in planes]
        return full[0] if self.channels == 1 else torch.stack(full, 1)

    def _unstack(self, y: Tensor) -> list[Tensor]:
        parts = [y] if self.channels == 1 else list(y.unbind(1))
        out = []
        for plane, part in zip(self.planes, parts):
            mv, mh = plane.shape
            sv, sh = plane.factors
            out.append(part[..., : mv * sv, : mh * sh])
        return out

    def coefficients(self, x: Tensor) -> list[Tensor]:
        """The stored planes' DCT coefficients of image x (B, C, H, W): one (..., mv, mh) tensor per
        plane, [0, 1] units, without JPEG's level shift (a coefficient c lies in the cell
        offset + q [k - 1/2, k + 1/2] of its integer k)."""
        return self.plane_coefficients(self._to_planes(x))

    def plane_coefficients(self, planes: list[Tensor]) -> list[Tensor]:
        """:meth:`coefficients` of full-resolution YCbCr planes (linear, no chroma offset)."""
        return [self._dct2(p.sample(u)) for p, u in zip(self.planes, planes)]

    def A(self, x: Tensor) -> Tensor:
        check_image(x, "x")
        self.measurement_shape(x.shape)
        c = self._consts(x)
        out = [p.upsample(self._dct2(c[f"weight{i}"] * coef, inverse=True))
               for i, (p, coef) in enumerate(zip(self.planes, self.coefficients(x)))]
        return self._stack(out)

    def A_adjoint(self, y: Tensor) -> Tensor:
        check_image(y, "y")
        self.image_shape(y.shape)
        c = self._consts(y)
        planes = [p.sample_adjoint(self._dct2(c[f"weight{i}"] * self._dct2(p.downsample(part)), inverse=True))
                  for i, (p, part) in enumerate(zip(self.planes, self._unstack(y)))]
        return self._from_planes(planes, inverse=False)

    def A_pinv(self, y: Tensor) -> Tensor:
        """C^-1 D^+ B^T diag(q / q_min) B T y: every coefficient divided by its weight, the planes at
        full resolution by the encoder's averaging's pseudo-inverse (chroma repeated over 2x2)."""
        check_image(y, "y")
        self.image_shape(y.shape)
        c = self._consts(y)
        planes = [p.sample_pinv(self._dct2(self._dct2(p.downsample(part)) / c[f"weight{i}"], inverse=True))
                  for i, (p, part) in enumerate(zip(self.planes, self._unstack(y)))]
        return self._from_planes(planes, inverse=True)

    # ------------------------------------------------------------------ the file's integers
    def measurement(self, k: list[Tensor]) -> Tensor:
        """The measurement y (B, C, Hp, Wp) of stored integers ``k`` (one (..., mv, mh) tensor per
        plane, as :meth:`quantise` gives): T^T (q_min k + (q_min / q) offset) per plane."""
        like = torch.empty(0, dtype=torch.float64, device=k[0].device)
        c = self._consts(like)
        out = [p.upsample(self._dct2(self.q_min * ki.to(torch.float64) + c[f"weight{i}"] * c[f"offset{i}"],
                                     inverse=True))
               for i, (p, ki) in enumerate(zip(self.planes, k))]
        return self._stack(out)

    def steps(self, coefficients: list[Tensor]) -> list[Tensor]:
        """Coefficients in units of their steps, the level shift removed: (c - offset) / q, whose
        rounding is the stored integer."""
        c = self._consts(coefficients[0])
        return [(ci - c[f"offset{i}"]) / c[f"step{i}"] for i, ci in enumerate(coefficients)]

    def quantise(self, x: Tensor) -> list[Tensor]:
        """The integers a JPEG encoder with these tables stores for image x (B, C, H, W) (up to its
        integer arithmetic): round((c - offset) / q) per plane, int64."""
        return [torch.round(s).long() for s in self.steps(self.coefficients(x))]

    def stored_integers(self, y: Tensor) -> list[Tensor]:
        """The integers k of a measurement y made by :meth:`measurement` (to the nearest integer
        for any other y)."""
        c = self._consts(y)
        return [torch.round((self._dct2(p.downsample(part)) - c[f"weight{i}"] * c[f"offset{i}"]) / self.q_min).long()
                for i, (p, part) in enumerate(zip(self.planes, self._unstack(y)))]

    def cells(self, k: list[Tensor], like: Tensor) -> list[tuple[Tensor, Tensor]]:
        """(lower, upper) bounds of each coefficient's quantisation cell, [0, 1] units, per plane."""
        c = self._consts(like)
        return [(c[f"offset{i}"] + c[f"step{i}"] * (ki.to(like.dtype) - 0.5),
                 c[f"offset{i}"] + c[f"step{i}"] * (ki.to(like.dtype) + 0.5)) for i, ki in enumerate(k)]

    def project(self, x: Tensor, k: list[Tensor] | Tensor, max_iter: int = 500, tol: float = 1e-6) -> Tensor:
        """The projection of x (B, C, H, W) onto the images whose coefficients lie in the cells of the
        stored integers ``k`` (or of the measurement y they gave): the nearest such image in the
        metric of the stored YCbCr planes' coefficients (chroma at its own resolution; the change of
        a subsampled chroma sample spread evenly over its pixels). One step where every stored sample
        is free; where the encoder's edge extension ties samples together (images whose size is not
        a multiple of the MCU), Dykstra's alternating projections, until no coefficient is outside its
        cell by more than ``tol`` steps or for ``max_iter`` iterations."""
        return project_onto_cells(self, x, k, max_iter, tol)


def project_onto_cells(op: JpegOperator, x: Tensor, k: list[Tensor] | Tensor, max_iter: int = 500,
                       tol: float = 1e-6) -> Tensor:
    """:meth:`JpegOperator.project`: x (B, C, H, W) moved into the cells of the integers ``k`` (or of
    the measurement that stores them)."""
    check_image(x, "x")
    op.measurement_shape(x.shape)
    if isinstance(k, Tensor):
        k = op.stored_integers(k.to(x.dtype))
    bounds = op.cells(k, x)
    planes = op._to_planes(x)
    out = []
    for i, (plane, u, (lo, hi)) in enumerate(zip(op.planes, planes, bounds)):
        step = op._consts(x)[f"step{i}"]
        v0 = plane.sample(u)

        def into_cells(v: Tensor) -> Tensor:
            coef = op._dct2(v)
            return v + op._dct2(torch.minimum(torch.maximum(coef, lo), hi) - coef, inverse=True)

        v = into_cells(v0)  # exact wherever the blocks are free
        if plane.coupled:  # Dykstra on the edge strips, between the cells and the samples D gives
            r0, c0 = plane.edge_strips()
            v0s = (v0[..., r0:, :], v0[..., :r0, c0:])
            cells = [(lo[..., r0:, :], hi[..., r0:, :], step[r0:, :]), (lo[..., :r0, c0:], hi[..., :r0, c0:],
                                                                           step[:r0, c0:])]

            def strip_cells(vs: tuple[Tensor, Tensor]) -> tuple[Tensor, ...]:
                out = []
                for t, (a, b, _) in zip(vs, cells):
                    if t.numel():
                        coef = op._dct2(t)
                        t = t + op._dct2(torch.minimum(torch.maximum(coef, a), b) - coef, inverse=True)
                    out.append(t)
                return tuple(out)

            def outside(vs: tuple[Tensor, ...]) -> float:
                worst = 0.0
                for t, (a, b, st) in zip(vs, cells):
                    if t.numel():
                        coef = op._dct2(t)
                        worst = max(worst, float(((coef - b).clamp_min(0) + (a - coef).clamp_min(0)).div(st).max()))
                return worst

            vs, ps, qs = v0s, tuple(torch.zeros_like(t) for t in v0s), tuple(torch.zeros_like(t) for t in v0s)
            for _ in range(max_iter):
                zs = strip_cells(tuple(a + b for a, b in zip(vs, ps)))
                ps = tuple(a + b - c for a, b, c in zip(vs, ps, zs))
                vs = plane.strips_range(*(a + b for a, b in zip(zs, qs)))
                qs = tuple(a + b - c for a, b, c in zip(zs, qs, vs))
                if outside(vs) <= tol:
                    break
            v = v.clone()
            v[..., r0:, :] = vs[0]
            v[..., :r0, c0:] = vs[1]
        out.append(u + plane.sample_pinv(v - v0))
    return op._from_planes(out, inverse=True)


@dataclass
class JpegMeasurement:
    """A JPEG file as a measurement. operator: its :class:`~nfc_dps.operators.jpeg.JpegOperator`;
    y: (1, C, Hp, Wp) float32, the measurement of the stored integers; integers: the stored integers,
    one (1, mv, mh) int64 tensor per plane ((1, 1, mv, mh) for gray); decoded: (1, C, H, W) float32
    in [0, 1], the file as a viewer shows it; file: the :class:`JpegFile`."""

    operator: JpegOperator
    y: Tensor
    integers: list[Tensor]
    decoded: Tensor
    file: JpegFile

    @property
    def sigma_y(self) -> float:
        """The measurement's noise std, [0, 1] units (q_min / sqrt(12))."""
        return self.operator.sigma_y


def jpeg_measurement(source: str | Path | JpegFile) -> JpegMeasurement:
    """The measurement of a JPEG file (a path or a :class:`JpegFile`): its integers recovered from the
    decoded pixels (:func:`decoded_planes`, then the operator's DCT, divided by the steps and rounded)."""
    jf = source if isinstance(source, JpegFile) else read_jpeg(source)
    op = JpegOperator(np.stack(jf.tables), jf.pixels.shape[:2], jf.subsampling, jf.channels)
    steps = op.steps(op.plane_coefficients(decoded_planes(jf)))
    integers = [torch.round(s).long() for s in steps]
    decoded = torch.from_numpy(jf.pixels.astype(np.float32) / 255.0)
    decoded = decoded[None, None] if decoded.ndim == 2 else decoded.permute(2, 0, 1)[None]
    return JpegMeasurement(op, op.measurement(integers).float(), integers, decoded.contiguous(), jf)
