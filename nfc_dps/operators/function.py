"""Any linear map given as a function: :class:`FunctionOperator`."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from .base import FAMILIES, LinearOperator

__all__ = ["FunctionOperator"]


def _shape(value: Sequence[int], name: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(v) for v in value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a sequence of positive ints, got {value!r}") from e
    if not shape or any(v < 1 for v in shape):
        raise ValueError(f"{name} must be a non-empty sequence of positive ints, got {value!r}")
    return shape


class FunctionOperator(LinearOperator):
    """A linear operator from a function ``A`` (a colour-filter array, a compressed-sensing
    matrix, a projection, a calibrated PSF bank, ...).

    Args:
        A: (B, *image_shape) -> (B, *measurement_shape), linear, applied to a batch.
        image_shape: one image's shape, (C, H, W).
        measurement_shape: one measurement's shape, e.g. (C, h, w); ``restore`` takes
            measurements of three axes, so a vector of m values is (1, m, 1).
        A_adjoint: (B, *measurement_shape) -> (B, *image_shape), the adjoint of ``A``; None:
            a vector-Jacobian product of ``A`` (one forward and one backward pass per call).
        name: its name in results records. family: one of ``FAMILIES`` ("other" unless the map
            is one of the built-in kinds; for "inpaint" NFC's default preset starts lower and DPIR
            starts from an interpolation of the observed pixels).
        device, dtype: where and in which precision the construction check runs (``A``'s; dtype
            None: torch's default). ``dtype`` stays the operator's ``dtype``: the classical
            baselines call ``A`` in it.

    The pseudo-inverse and the proximal solve are the base class's conjugate gradients. On
    construction ``A`` is applied once to zeros of ``image_shape`` (its output shape must be
    ``measurement_shape``), and a given ``A_adjoint`` is checked against ``A`` on one random pair
    (<A x, y> = <x, A^T y>, relative 1e-3). Units: any ([0, 1] images in ``restore``; the
    measurement's range is whatever ``A`` gives, only its finiteness is checked there).
    """

    name = "function"

    def __init__(self, A: Callable[[Tensor], Tensor], image_shape: Sequence[int], measurement_shape: Sequence[int],
                 A_adjoint: Callable[[Tensor], Tensor] | None = None, *, name: str = "function", family: str = "other",
                 device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not callable(A):
            raise TypeError(f"A must be callable on a (B, *image_shape) tensor, got {type(A).__name__}")
        if A_adjoint is not None and not callable(A_adjoint):
            raise TypeError(f"A_adjoint must be callable or None, got {type(A_adjoint).__name__}")
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
        self.forward_fn, self.adjoint_fn = A, A_adjoint
        self.image_dims = _shape(image_shape, "image_shape")
        self.measurement_dims = _shape(measurement_shape, "measurement_shape")
        self.name, self.family = str(name), family
        self.dtype = dtype or torch.get_default_dtype()  # A's precision
        self._check(torch.device(device), self.dtype)

    def _check(self, device: torch.device, dtype: torch.dtype) -> None:
        """A's output shape on zeros; a given adjoint against A on one random pair."""
        out = self.A(torch.zeros((1, *self.image_dims), dtype=dtype, device=device))
        if self.adjoint_fn is None:
            return
        gen = torch.Generator(device=device).manual_seed(0)
        x = torch.randn((1, *self.image_dims), generator=gen, dtype=dtype, device=device)
        y = torch.randn(out.shape, generator=gen, dtype=dtype, device=device)
        ax, aty = self.A(x), self.A_adjoint(y)
        lhs, rhs = float((ax * y).sum()), float((x * aty).sum())
        scale = float(ax.norm() * y.norm()) + float(x.norm() * aty.norm())
        if abs(lhs - rhs) > 1e-3 * max(scale, 1e-12):
            raise ValueError(f"A_adjoint is not the adjoint of A: <A x, y> = {lhs:.6g} but <x, A_adjoint(y)> = "
                             f"{rhs:.6g} for random x, y (pass A_adjoint=None for the autograd adjoint)")

    def _expect(self, t: Tensor, dims: tuple[int, ...], what: str) -> None:
        if not isinstance(t, Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape[1:]) != dims or t.ndim != len(dims) + 1:
            raise ValueError(f"{what} must have shape (B, {', '.join(map(str, dims))}), got {tuple(t.shape)}")

    def A(self, x: Tensor) -> Tensor:
        self._expect(x, self.image_dims, "the image")
        out = self.forward_fn(x)
        self._expect(out, self.measurement_dims, f"A's output for an image of shape {tuple(x.shape)}")
        return out

    def A_adjoint(self, y: Tensor) -> Tensor:
        self._expect(y, self.measurement_dims, "the measurement")
        if self.adjoint_fn is not None:
            out = self.adjoint_fn(y)
        else:
            out = self._vjp(y)
        self._expect(out, self.image_dims, f"A_adjoint's output for a measurement of shape {tuple(y.shape)}")
        return out

    def _vjp(self, y: Tensor) -> Tensor:
        """A^T y as the vector-Jacobian product of A at 0 (exact: A is linear); differentiable in
        y when y requires grad."""
        with torch.inference_mode(False), torch.enable_grad():
            if y.is_inference():
                y = y.clone()
            x = torch.zeros((y.shape[0], *self.image_dims), dtype=y.dtype, device=y.device, requires_grad=True)
            (grad,) = torch.autograd.grad(self.forward_fn(x), x, grad_outputs=y, create_graph=y.requires_grad)
        return grad

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        if tuple(image_shape[1:]) != self.image_dims:
            raise ValueError(f"this operator takes images of shape (B, {', '.join(map(str, self.image_dims))}), "
                             f"got {tuple(image_shape)}")
        return (int(image_shape[0]), *self.measurement_dims)

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        if tuple(measurement_shape[1:]) != self.measurement_dims:
            raise ValueError(f"this operator's measurements have shape (B, {', '.join(map(str, self.measurement_dims))}), "
                             f"got {tuple(measurement_shape)}")
        return (int(measurement_shape[0]), *self.image_dims)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "image_shape": list(self.image_dims),
                "measurement_shape": list(self.measurement_dims), "adjoint": "given" if self.adjoint_fn else "autograd"}
