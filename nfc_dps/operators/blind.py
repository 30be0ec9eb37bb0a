"""A blur whose kernel is unknown (blind deblurring): the kernel is estimated from each photograph.

:class:`BlindBlur` is a :class:`~nfc_dps.operators.blur.BlurOperator` of a stated kernel size whose
kernel is its current estimate: a Gaussian of std size / 10 until :meth:`BlindBlur.fitted`
estimates the photograph's own kernel from the photo alone
(:func:`~nfc_dps.operators.kernel_estimation.estimate_kernel`), and :meth:`BlindBlur.refined`
re-estimates it from a restoration (:func:`~nfc_dps.operators.kernel_estimation.kernel_step` on
its strongest edges). :func:`nfc_dps.restore` fits the operator to each photo, restores, and
refines ``refinements`` times (each a restoration more), so every method restores with the
estimated kernel, taking the kernel's error as added noise (``model_error``); the restoration
carries the kernel (``Restoration.kernel``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from .blur import BlurOperator
from .kernel_estimation import KernelEstimator, check_estimable, check_kernel_size, estimate_kernel, kernel_step
from .kernels import gaussian_kernel

__all__ = ["BlindBlur"]


#: the fraction of a restoration's strongest gradients a refinement fits the kernel to
REFINE_SALIENT = 0.1
#: the estimated kernel's error, restored as Gaussian noise of this many times the measurement noise's
#: std (under Gaussian noise σ the restoration assumes 2σ): chosen on validation crops (docs/notes/blind.md)
KERNEL_ERROR_NOISE = 3 ** 0.5


class BlindBlur(BlurOperator):
    """A blur by an unknown (size, size) kernel; its kernel the current estimate.

    Args:
        size: the kernel's side in px, odd, >= 3: as long as the longest shake in the photo
            (a kernel too small cannot hold the blur; one much too large is harder to estimate).
        boundary: as :class:`BlurOperator`'s; ``"valid"`` (a photograph's) by default.
        estimator: the estimator's settings (:class:`KernelEstimator`).
        refinements: how many times :func:`nfc_dps.restore` re-estimates the kernel from its
            restoration and restores again (each costs one restoration's network calls).
        kernel: the current estimate (None: the Gaussian guess, not yet fitted to a photo). A blind
            blur given its kernel is fitted: :func:`nfc_dps.restore` restores with that kernel as it
            is (no estimation, no refinements).
    """

    name = "blind_blur"
    model_error = KERNEL_ERROR_NOISE

    def __init__(self, size: int, boundary: str = "valid", estimator: KernelEstimator = KernelEstimator(),
                 refinements: int = 2, kernel: Tensor | None = None) -> None:
        size = check_kernel_size(size)
        if isinstance(refinements, bool) or not isinstance(refinements, int) or refinements < 0:
            raise ValueError(f"BlindBlur: refinements must be an int >= 0, got {refinements!r}")
        super().__init__(gaussian_kernel(size, size / 10) if kernel is None else kernel, boundary)
        self.size, self.estimator, self.refinements = size, estimator, refinements
        self.fitted_per_image = kernel is None  # a fitted one restores as the blur it is

    def _with(self, kernel: Tensor) -> "BlindBlur":
        return BlindBlur(self.size, self.boundary, self.estimator, self.refinements,
                         kernel.to(torch.float32)).to(self.kernel.device)

    @staticmethod
    def _photo(y: Tensor) -> Tensor:
        if y.ndim == 4:
            if y.shape[0] != 1:
                raise ValueError(f"BlindBlur estimates one photo's kernel at a time, got a batch of {y.shape[0]}")
            y = y[0]
        return y.detach().cpu()

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        """As a blur's; while the kernel is still to be estimated, ValueError naming the sizes if the
        photo is too small for it."""
        if self.fitted_per_image:
            check_estimable(*measurement_shape[-2:], self.size)
        return super().image_shape(measurement_shape)

    def fitted(self, y: Tensor, callback: Callable[[int, int], None] | None = None) -> "BlindBlur":
        """This blur with the kernel estimated from the photo ``y`` ((1, C, h, w) or (C, h, w), [0, 1])
        alone; ValueError naming the sizes if the photo is too small for the kernel."""
        y = self._photo(y)
        check_estimable(*y.shape[-2:], self.size)
        report = None if callback is None else (lambda i, n, k: callback(i + 1, n))
        return self._with(estimate_kernel(y, self.size, self.estimator, report))

    def refined(self, y: Tensor, x: Tensor) -> "BlindBlur":
        """This blur with its kernel re-estimated from the photo ``y`` and a restoration ``x`` of it
        ((1, C, H, W) or (C, H, W), the scene: H = h + size - 1 for a valid boundary)."""
        y, x = self._photo(y), self._photo(x)
        if self.boundary != "valid":  # the photo is the scene's size: fit its interior
            m = self.size // 2
            y = y[..., m:y.shape[-2] - m, m:y.shape[-1] - m]
        kernel = kernel_step(x, y, self.size, self.kernel.double().cpu(), self.estimator.gamma,
                             self.estimator.threshold, salient=REFINE_SALIENT)
        return self._with(kernel)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "kernel": "estimated from each photo", "refinements": self.refinements}
