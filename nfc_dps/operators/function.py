"""Any linear map given as a function: :class:`FunctionOperator`."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from .base import FAMILIES, LinearOperator
from .nonlinear import NonlinearFunctionOperator, as_shape

__all__ = ["FunctionOperator"]


def _check_gradient(op: Any, device: Any, dtype: torch.dtype | None) -> None:
    """ValueError when a nonlinear map's gradient is zero on a mid-grey and a seeded random image
    in [0, 1] (a seeded random direction): A detaches its input, rounds, thresholds or is
    constant, and the samplers' data step, which follows that gradient, would ignore the measurement;
    or when A is not finite on seeded images in [-0.5, 1.5], where the samplers' iterates go."""
    dtype = dtype or torch.get_default_dtype()
    gen = torch.Generator().manual_seed(1)
    x = torch.rand((2, *op.image_shape_), generator=gen, dtype=dtype).to(device)
    x[0] = 0.5
    y = op.A(x)
    u = torch.randn(y.shape, generator=gen, dtype=y.dtype).to(y.device)
    if not torch.any(op.vjp(x, u) != 0):
        raise ValueError(f"A's gradient is zero on images in [0, 1] of shape {tuple(x.shape)} (A detaches its input, "
                         f"rounds, thresholds or is constant): the samplers' data step follows A's gradient and would "
                         f"ignore the measurement; write A with differentiable torch operations")
    beyond = (-0.5 + 2.0 * torch.rand((2, *op.image_shape_), generator=gen, dtype=dtype)).to(device)
    with torch.no_grad():
        finite = bool(torch.isfinite(op.A(beyond)).all())
    if not finite:  # the samplers' iterates leave [0, 1] on the way: A is evaluated there
        raise ValueError(f"A gives NaN/Inf on images in [-0.5, 1.5] of shape {tuple(beyond.shape)}: the samplers' "
                         f"iterates leave [0, 1] on the way and are measured there; make A finite beyond [0, 1], e.g. "
                         f"clamp its input (A(x.clamp(0, 1)))")


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
        linear: False for a differentiable nonlinear map: the call then returns a
            :class:`~nfc_dps.operators.nonlinear.NonlinearFunctionOperator` (no ``A_adjoint``,
            ``family`` or ``dtype``; Jacobian products by autograd).
        name: its name in results records. family: one of ``FAMILIES`` ("other" unless the map
            is one of the built-in kinds; for "inpaint" NFC's default preset starts lower and DPIR
            starts from an interpolation of the observed pixels).
        device, dtype: where and in which precision the construction check runs (``A``'s; dtype
            None: torch's default). ``dtype`` stays the operator's ``dtype``: the classical
            baselines call ``A`` in it.

    The pseudo-inverse and the proximal solve are the base class's conjugate gradients. Shapes
    take Python or numpy integers; a non-integral size is refused. On construction ``A`` is
    applied to a batch of two zero images and of two seeded random ones (a torch.Tensor of
    ``measurement_shape`` with the input's batch size; ValueError naming the failure otherwise):
    A(0) must be 0 and A(a x + b y) = a A(x) + b A(y) (relative 1e-4 in float32): an affine or
    nonlinear map is refused, naming the failure. Without ``A_adjoint`` the autograd adjoint is
    run once (TypeError when ``A`` leaves torch, e.g. through numpy); a given ``A_adjoint`` is
    checked against ``A`` on one random pair (<A x, y> = <x, A^T y>, relative 1e-3). Every call
    checks the output's type, shape and batch size. Units: any ([0, 1] images in ``restore``;
    the measurement's range is whatever ``A`` gives, only its finiteness is checked there).
    """

    name = "function"

    def __new__(cls, A: Callable[[Tensor], Tensor], image_shape: Sequence[int], measurement_shape: Sequence[int],
                A_adjoint: Callable[[Tensor], Tensor] | None = None, *, linear: bool = True, name: str = "function",
                **kwargs: Any) -> Any:
        if linear is True:
            return super().__new__(cls)
        if linear is not False:
            raise TypeError(f"linear must be True or False, got {linear!r}")
        if A_adjoint is not None:
            raise ValueError("a nonlinear map (linear=False) has no adjoint: its vector-Jacobian products come from "
                             "autograd; pass A_adjoint=None")
        if "family" in kwargs:
            raise ValueError(f"family={kwargs['family']!r}: a nonlinear map's family is 'nonlinear'; drop the argument")
        op = NonlinearFunctionOperator(A, image_shape, measurement_shape, name=name, **kwargs)
        _check_gradient(op, kwargs.get("device", "cpu"), kwargs.get("dtype"))
        return op

    def __init__(self, A: Callable[[Tensor], Tensor], image_shape: Sequence[int], measurement_shape: Sequence[int],
                 A_adjoint: Callable[[Tensor], Tensor] | None = None, *, linear: bool = True, name: str = "function",
                 family: str = "other", device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not callable(A):
            raise TypeError(f"A must be callable on a (B, *image_shape) tensor, got {type(A).__name__}")
        if A_adjoint is not None and not callable(A_adjoint):
            raise TypeError(f"A_adjoint must be callable or None, got {type(A_adjoint).__name__}")
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
        self.forward_fn, self.adjoint_fn = A, A_adjoint
        self.image_dims = as_shape(image_shape, "image_shape")
        self.measurement_dims = as_shape(measurement_shape, "measurement_shape")
        self.name, self.family = str(name), family
        self.dtype = dtype or torch.get_default_dtype()  # A's precision
        self._check(torch.device(device), self.dtype)

    def _check(self, device: torch.device, dtype: torch.dtype) -> None:
        """On a batch of two seeded random images x, y (and zeros): A's output type and shape
        (batch kept), A(0) = 0 and A(a x + b y) = a A(x) + b A(y) (relative :meth:`_tolerance`);
        the autograd adjoint runs, or a given adjoint matches A (<A x, y> = <x, A^T y>, relative 1e-3)."""
        gen = torch.Generator(device=device).manual_seed(0)
        shape = (2, *self.image_dims)
        zero = self.A(torch.zeros(shape, dtype=dtype, device=device))
        x, u = (torch.randn(shape, generator=gen, dtype=dtype, device=device) for _ in range(2))
        a, b = 0.75, -1.25
        ax, au, mixed = self.A(x), self.A(u), self.A(a * x + b * u)
        for what, t in (("A(0)", zero), ("A(x)", ax), ("A(a x + b y)", mixed)):
            if not torch.isfinite(t).all():
                raise ValueError(f"{what} holds non-finite values for seeded random images x, y of shape {shape}: "
                                 f"A must be a linear map defined on every image")
        tol = self._tolerance(dtype)
        scale = float(ax.norm()) + float(au.norm())
        if float(zero.norm()) > tol * max(scale, 1e-30):
            raise ValueError(f"A is not linear: A(0) is not 0 (largest |A(0)| = {float(zero.abs().max()):.4g}; an "
                             f"offset, an affine map?). FunctionOperator needs a linear map (A(0) = 0): subtract the "
                             f"offset A(0) from the measurement and from A, or declare the map nonlinear: "
                             f"FunctionOperator(..., linear=False)")
        size = max(abs(a) * float(ax.norm()) + abs(b) * float(au.norm()), 1e-30)
        err = float((mixed - (a * ax + b * au)).norm())
        if err > tol * size:
            raise ValueError(f"A is not linear: A(a x + b y) differs from a A(x) + b A(y) by {err:.4g} (relative "
                             f"{err / size:.3g}, tolerance {tol:.1g}) for a = {a}, b = {b} and seeded random images "
                             f"x, y. FunctionOperator needs a linear map (A(a x + b y) = a A(x) + b A(y) for every "
                             f"x, y); a nonlinear map: FunctionOperator(..., linear=False)")
        y = torch.randn(ax.shape, generator=gen, dtype=dtype, device=device)
        if self.adjoint_fn is None:
            try:
                self.A_adjoint(y)
            except (RuntimeError, TypeError) as e:
                raise TypeError(f"A_adjoint=None takes the adjoint as autograd's vector-Jacobian product of A, and A "
                                f"does not run under autograd ({type(e).__name__}: {e}): write A with torch "
                                f"operations on its input (no numpy), or pass A_adjoint") from e
            return
        aty = self.A_adjoint(y)
        lhs, rhs = float((ax * y).sum()), float((x * aty).sum())
        scale = float(ax.norm() * y.norm()) + float(x.norm() * aty.norm())
        if abs(lhs - rhs) > 1e-3 * max(scale, 1e-12):
            raise ValueError(f"A_adjoint is not the adjoint of A: <A x, y> = {lhs:.6g} but <x, A_adjoint(y)> = "
                             f"{rhs:.6g} for random x, y (pass A_adjoint=None for the autograd adjoint)")

    @staticmethod
    def _tolerance(dtype: torch.dtype) -> float:
        """The relative error the linearity check allows in ``dtype``: 1e-4, or 16 ulp where coarser."""
        return max(1e-4, 16 * torch.finfo(dtype).eps)

    def _expect(self, t: Any, dims: tuple[int, ...], what: str, batch: int | None = None) -> None:
        if not isinstance(t, Tensor):
            hint = " (convert with torch.from_numpy, or better compute with torch operations)" \
                if isinstance(t, np.ndarray) else ""
            raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__module__}.{type(t).__name__}{hint}")
        if tuple(t.shape[1:]) != dims or t.ndim != len(dims) + 1:
            raise ValueError(f"{what} must have shape (B, {', '.join(map(str, dims))}), got {tuple(t.shape)}")
        if batch is not None and t.shape[0] != batch:
            raise ValueError(f"{what} has {t.shape[0]} item(s) on the batch axis, the input {batch}: each image of a "
                             f"batch needs its own output (axis 0 is the batch)")

    def A(self, x: Tensor) -> Tensor:
        self._expect(x, self.image_dims, "the image")
        out = self.forward_fn(x)
        self._expect(out, self.measurement_dims, f"A's output for an image of shape {tuple(x.shape)}", x.shape[0])
        return out

    def A_adjoint(self, y: Tensor) -> Tensor:
        self._expect(y, self.measurement_dims, "the measurement")
        if self.adjoint_fn is not None:
            out = self.adjoint_fn(y)
        else:
            out = self._vjp(y)
        self._expect(out, self.image_dims, f"A_adjoint's output for a measurement of shape {tuple(y.shape)}",
                     y.shape[0])
        return out

    def _vjp(self, y: Tensor) -> Tensor:
        """A^T y as the vector-Jacobian product of A at 0 (exact: A is linear); differentiable in
        y when y requires grad."""
        with torch.inference_mode(False), torch.enable_grad():
            if y.is_inference():
                y = y.clone()
            x = torch.zeros((y.shape[0], *self.image_dims), dtype=y.dtype, device=y.device, requires_grad=True)
            (grad,) = torch.autograd.grad(self.A(x), x, grad_outputs=y, create_graph=y.requires_grad)
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
