"""The catalogue of classical methods: one :class:`ClassicalMethod` entry per method in
:data:`CLASSICAL`, and the one way to call them::

    x = restore_classical(name, operator, y, noise)      # y, x: (B, C, h, w) tensors in [0, 1]

``noise`` is a :class:`~nfc_dps.noise.NoiseModel` or the std of Gaussian noise in [0, 1] pixel
units. No classical method needs a prior. Each entry declares what it restores: the kind of
operator (:data:`OPERATOR_KINDS`: a linear operator's image, a JPEG file's quantisation cells, a
nonlinear operator), the operator classes it is written for where it reads their internals, the
noise kinds it takes, whether it takes an operator on a padded canvas, and why it cannot restore
some operators of its kind. :func:`applicable` answers from those declarations; every list of
classical methods elsewhere (the benchmark's columns and labels, the oracle's rows, the nonlinear
tier's answers) is read from :data:`CLASSICAL`, so adding a method is one entry here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ..noise import GaussianNoise, NoiseModel
from ..operators.base import LinearOperator, check_image
from ..operators.nonlinear import CameraBlur, Exposure, HighDynamicRange, PhaseRetrieval, is_linear
from .linear import (
    NotApplicable,
    bicubic_upsample,
    biharmonic_inpaint,
    has_quantisation_cells,
    qcs_tv,
    tv_restore,
    wiener,
    wiener_problem,
)
from .nonlinear import anscombe_tv, camera_tv, hdr_inverse_inpaint, hio_er, richardson_lucy

__all__ = ["ClassicalMethod", "CLASSICAL", "OPERATOR_KINDS", "operator_kind", "classical_method", "applicable",
           "classical_methods", "restore_classical"]

#: the kinds of operator a classical method restores (``ClassicalMethod.operator_kind``), in words
OPERATOR_KINDS = {
    "linear": "a linear operator's image",
    "jpeg": "a JPEG file's measurement (quantisation cells)",
    "nonlinear": "a nonlinear operator's measurement",
}


@dataclass(frozen=True)
class ClassicalMethod:
    """A restoration without a prior and what it restores.

    ``restore(operator, y, noise, **kwargs)``: the estimate (B, C, H, W) of the measurement ``y``
    under the noise model ``noise``, not yet clipped (the Gaussian oracle scores it unclipped).
    """

    restore: Callable[..., Tensor]
    #: the name tables show ("Wiener")
    label: str
    #: the operators it restores, a key of OPERATOR_KINDS
    operator_kind: str = "linear"
    #: the operator classes it is written for (it reads their internals); empty: any of its kind
    operator_types: tuple[type, ...] = ()
    #: why it cannot restore an operator of its kind and types (None: it can)
    operator_problem: Callable[[LinearOperator], str | None] = lambda operator: None
    #: the noise models (``nfc_dps.noise``'s ``kind``) it restores
    noise_kinds: frozenset[str] = frozenset({"gaussian"})
    #: it takes an operator that sees part of a larger canvas (``image_region()`` set)
    takes_canvas: bool = False

    def noise_problem(self, noise: NoiseModel) -> str | None:
        """Why the method cannot restore measurements under ``noise`` (None: it can)."""
        if noise.kind in self.noise_kinds:
            return None
        kinds = " or ".join(kind.capitalize() for kind in sorted(self.noise_kinds))
        return f"is a classical baseline for {kinds} noise, not {noise}"


def _family_only(family: str, what: str) -> Callable[[LinearOperator], str | None]:
    """An ``operator_problem``: ``what`` is for operators of ``family`` only."""
    return lambda operator: None if operator.family == family else f"{what}, got {type(operator).__name__}"


CLASSICAL: dict[str, ClassicalMethod] = {
    "wiener": ClassicalMethod(lambda op, y, noise, **kw: wiener(op, y, noise.gaussian_sigma, **kw), "Wiener",
                              operator_problem=wiener_problem),
    "tv": ClassicalMethod(lambda op, y, noise, **kw: tv_restore(op, y, noise.gaussian_sigma, **kw), "TV",
                          takes_canvas=True),
    "bicubic": ClassicalMethod(lambda op, y, noise: bicubic_upsample(y, op.downsampling_factor), "bicubic",
                               operator_problem=_family_only("sr", "bicubic upsampling is for super-resolution only")),
    "biharmonic": ClassicalMethod(lambda op, y, noise: biharmonic_inpaint(op, y), "biharmonic",
                                  operator_problem=_family_only("inpaint", "biharmonic inpainting is for inpainting only")),
    "qcs_tv": ClassicalMethod(lambda op, y, noise, **kw: qcs_tv(op, y, noise.gaussian_sigma, **kw), "QCS + TV",
                              operator_kind="jpeg"),
    "hio_er": ClassicalMethod(lambda op, y, noise, **kw: hio_er(op, y, **kw), "HIO + ER (4 starts)",
                              operator_kind="nonlinear", operator_types=(PhaseRetrieval,)),
    "hdr_inverse_inpaint": ClassicalMethod(lambda op, y, noise, **kw: hdr_inverse_inpaint(op, y, **kw),
                                           "unclipped inverse + biharmonic inpainting", operator_kind="nonlinear",
                                           operator_types=(HighDynamicRange, Exposure)),
    "camera_tv": ClassicalMethod(lambda op, y, noise: camera_tv(op, y, noise.gaussian_sigma), "TV in linear light",
                                 operator_kind="nonlinear", operator_types=(CameraBlur,)),
    "richardson_lucy": ClassicalMethod(lambda op, y, noise, **kw: richardson_lucy(op, y, noise.peak, **kw),
                                       "Richardson-Lucy", noise_kinds=frozenset({"poisson"}),
                                       operator_problem=_family_only("blur", "Richardson-Lucy is for deblurring only")),
    "anscombe_tv": ClassicalMethod(lambda op, y, noise, **kw: anscombe_tv(y, noise.peak, **kw), "Anscombe + TV",
                                   noise_kinds=frozenset({"poisson"}),
                                   operator_problem=_family_only("denoise", "Anscombe + TV is for denoising only")),
}


def classical_method(name: str) -> ClassicalMethod:
    """The catalogue's entry ``name`` (ValueError naming the methods for an unknown one)."""
    if name not in CLASSICAL:
        raise ValueError(f"unknown classical baseline {name!r}; choose one of {tuple(CLASSICAL)}")
    return CLASSICAL[name]


def operator_kind(operator: LinearOperator) -> str:
    """The key of :data:`OPERATOR_KINDS` that ``operator`` is: "jpeg" when its measurement is a set of
    quantisation cells, "nonlinear" when it is not linear, else "linear"."""
    if has_quantisation_cells(operator):
        return "jpeg"
    return "linear" if is_linear(operator) else "nonlinear"


def applicable(name: str, operator: LinearOperator) -> str | None:
    """None if classical method ``name`` restores ``operator``'s measurements, else the reason it does not."""
    method = classical_method(name)
    kind = operator_kind(operator)
    if kind != method.operator_kind:
        return _kind_problem(name, method, operator, kind)
    if method.operator_types and not isinstance(operator, method.operator_types):
        written_for = " or ".join(t.__name__ for t in method.operator_types)
        return f"{name} is written for {written_for}, got {type(operator).__name__}"
    if not method.takes_canvas and operator.image_region() is not None:
        return f"{name} needs the operator on the whole image grid, got one on a padded canvas"
    return method.operator_problem(operator)


def _kind_problem(name: str, method: ClassicalMethod, operator: LinearOperator, kind: str) -> str:
    """Why method ``name`` does not restore ``operator``, an operator of another kind (``kind``)."""
    if kind == "jpeg":
        return (f"{name} does not fit a JPEG measurement (quantised DCT coefficients, not an image); "
                f"{_restorations_of(operator, kind)}")
    if kind == "nonlinear":
        return f"{name} takes a linear operator, not the nonlinear {operator.name}; {_restorations_of(operator, kind)}"
    return f"{name} restores {OPERATOR_KINDS[method.operator_kind]}, got the linear {operator.name}"


def _restorations_of(operator: LinearOperator, kind: str) -> str:
    """The methods of ``kind`` (the operator's) that restore ``operator``, as the end of a message."""
    names = [repr(n) for n, m in CLASSICAL.items() if m.operator_kind == kind and applicable(n, operator) is None]
    return f"its classical restoration is {' or '.join(names)}" if names else "no classical method restores it"


def classical_methods(operator: LinearOperator, noise_kind: str = "gaussian") -> tuple[str, ...]:
    """The methods that restore ``operator``'s measurements under noise of ``noise_kind``, in catalogue order."""
    return tuple(name for name, m in CLASSICAL.items() if noise_kind in m.noise_kinds and applicable(name, operator) is None)


def _noise_model(noise: NoiseModel | float) -> NoiseModel:
    """``noise`` as a noise model: a model as is, a number as the std of Gaussian noise."""
    if isinstance(noise, NoiseModel):
        return noise
    if isinstance(noise, (int, float)) and noise >= 0 and math.isfinite(noise):
        return GaussianNoise(noise)
    raise ValueError(f"noise must be a NoiseModel or a Gaussian sigma_y (a finite number >= 0, [0, 1] units), "
                     f"got {noise!r}")


def restore_classical(name: str, operator: LinearOperator, y: Tensor, noise: NoiseModel | float, **kwargs) -> Tensor:
    """Restore ``y`` (B, C, h, w) in [0, 1] with classical method ``name`` under ``noise`` (a noise
    model, or a Gaussian std in [0, 1] units); (B, C, H, W) in [0, 1]. ``kwargs`` go to the method's
    function (``lam`` for TV, ``iterations`` for Richardson-Lucy, ...).

    Raises :class:`NotApplicable` when the method does not apply to the operator or the noise.
    """
    reason = applicable(name, operator)
    if reason is not None:
        raise NotApplicable(reason)
    check_image(y, "y")
    noise = _noise_model(noise)
    method = CLASSICAL[name]
    why = method.noise_problem(noise)
    if why is not None:
        raise NotApplicable(f"{name} {why}")
    with torch.no_grad():
        x = method.restore(operator, y, noise, **kwargs)
    return x.clamp(0, 1)
