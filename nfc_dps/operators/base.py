"""Linear forward operators ``y = A x + n`` on batched images (B, C, H, W).

An operator knows the measurement and nothing of diffusion. Every operator provides:

* ``A(x)`` and ``A_adjoint(y)`` (a true adjoint: <A x, y> = <x, A^T y>);
* ``decomposition()``: A = U diag(d) V^H in a Fourier, pixel or channel basis where the operator
  has one (:mod:`~nfc_dps.operators.decomposition`), else None;
* ``A_pinv(y)``: a pseudo-inverse (A A^+ A = A);
* ``prox(y, z, sigma_y, r)``: argmin_x ||y - A x||^2 / (2 sigma_y^2) + ||x - z||^2 / (2 r^2), the
  Gaussian-conditional mean. Both are derived here from the decomposition, in closed form; an
  operator without one either has its own closed form (SR) or gets conjugate gradients, which stop
  after ``max_iter`` iterations: where r / sigma_y is large the system is ill-conditioned and the
  result an early-stopped approximation (see :func:`normal_equations_prox`).
  ``sigma_y`` and ``r`` are floats or (B,) tensors (per image);
* ``measure(x, sigma_y, generator)``: A x plus seeded Gaussian noise of std ``sigma_y``.

Every operator also *declares its structure*, so samplers and baselines ask it instead of
testing its class (the safe defaults of :class:`LinearOperator` say "nothing known"):

* ``family``: what it measures, one of :data:`FAMILIES`;
* ``image_channels``: the channels of the images it takes where it fixes them (colorization: 3),
  else None;
* ``is_circulant``: A = F^-1 diag(H) F on the image grid, H = ``transfer_function(h, w)``;
* ``pixel_mask()``: the (H, W) 0/1 mask m when A x = m * x (inpainting), else None;
* ``blur_kernel()``: the (kh, kw) convolution kernel of a blur, else None;
* ``downsampling_factor``: the integer factor s of a downscaling (SR), else None;
* ``gram_eigenvalues(h, w)``: the eigenvalues of A^T A for an (h, w) image (h * w values, the same
  for every channel; C * h * w for an operator that mixes the channels), where the structure gives
  them (a decomposition, separable SR), else None;
* ``approximate_gram_eigenvalues(h, w)``: the same where they are declared, else an
  approximation the operator vouches for (a reflect-boundary blur: those of the circular blur
  with its kernel; for a kernel smaller than the image the two operators differ only within its
  half-width of the border), else None;
* ``image_region()``: (h, w) of the top-left part of the image that A sees when the image lies
  on a larger canvas (:class:`~nfc_dps.operators.padding.CroppedOperator`), else None;
* ``describe()``: a JSON-able record of the operator for results files.

Operators are linear, so they work in any units; the public API uses [0, 1] images and states
``sigma_y`` in [0, 1] pixel units. ``A(ones)`` is the operator's DC response (1 for blur and
SR, the mask for inpainting); the sampler uses it to map measurements to [-1, 1] model units.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from ..generators import randn_per_image
from ..noise import as_noise, noise_sigma_problem  # noqa: F401 - re-exported: the operators' users check sigma_y
from .decomposition import Decomposition


def per_image(value: float | Tensor, x: Tensor) -> Tensor:
    """Broadcast a float or (B,) tensor to shape (B, 1, 1, 1) for elementwise use with x."""
    v = torch.as_tensor(value, dtype=x.dtype, device=x.device)
    if v.ndim == 0:
        return v.expand(x.shape[0]).view(-1, 1, 1, 1)
    if v.shape != (x.shape[0],):
        raise ValueError(f"expected a scalar or a ({x.shape[0]},) tensor, got shape {tuple(v.shape)}")
    return v.view(-1, 1, 1, 1)


def check_image(x: Tensor, name: str = "x") -> None:
    """Raise ValueError unless x is a finite float (B, C, H, W) tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"{name} must have shape (B, C, H, W), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    # a finite sum implies every element is finite: one reduction on the operators' hot path, far
    # cheaper than an elementwise test; only when the sum overflows or is NaN does that test decide
    if not bool(torch.isfinite(x.sum())) and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or Inf")


def _describe(value: float | Tensor) -> str:
    if isinstance(value, Tensor):
        return f"{value.tolist()}" if value.numel() <= 8 else f"tensor of shape {tuple(value.shape)}"
    return repr(value)


def prox_scales(sigma_y: float | Tensor, r: float | Tensor, like: Tensor) -> tuple[Tensor, Tensor]:
    """(sigma_y^2, r^2) as (B, 1, 1, 1) tensors for a proximal solve on ``like`` (B, ...).

    Raises ValueError unless sigma_y > 0 and r > 0 (r = inf is allowed: no prior term) and
    sigma_y is finite; a zero sigma_y or r would otherwise give NaN silently.
    """
    s = per_image(sigma_y, like)
    rr = per_image(r, like)
    if bool(torch.isnan(s).any()) or bool(torch.isinf(s).any()) or bool((s <= 0).any()):
        raise ValueError(f"sigma_y must be finite and > 0 for a proximal solve, got {_describe(sigma_y)}")
    if bool(torch.isnan(rr).any()) or bool((rr <= 0).any()):
        raise ValueError(f"r must be > 0 for a proximal solve, got {_describe(r)}")
    return s * s, rr * rr


#: operator families (``LinearOperator.family``)
FAMILIES = ("blur", "sr", "inpaint", "denoise", "other")


class LinearOperator(torch.nn.Module):
    """Base class. Subclasses implement ``A`` and ``A_adjoint``; override the rest when they can.

    The structure declarations (module docstring) default to "nothing known": family "other",
    not circulant, no mask, kernel or factor. Subclasses override those that hold. (Names differ
    from the subclasses' buffers ``kernel`` and ``mask``, which ``register_buffer`` owns.)
    """

    #: short name used in configs and tables
    name: str = "linear"
    #: what the operator measures, one of FAMILIES
    family: str = "other"
    #: True when A = F^-1 diag(H) F on the image grid, H = transfer_function(h, w)
    is_circulant: bool = False
    #: the number of channels of the images A takes; None: any (A acts on each channel alike)
    image_channels: int | None = None

    def transfer_function(self, h: int, w: int, dtype: torch.dtype = torch.float32,
                          device: torch.device | str | None = None) -> Tensor:
        """Complex (h, w) H with A x = ifft2(H * fft2(x)).real; only for circulant operators.

        complex64 unless ``dtype`` is float64. Raises ValueError when ``is_circulant`` is False.
        """
        raise ValueError(f"{type(self).__name__} is not circulant: it has no transfer function")

    def pixel_mask(self) -> Tensor | None:
        """The (H, W) float32 0/1 mask m when A x = m * x (1 = observed), else None."""
        return None

    def blur_kernel(self) -> Tensor | None:
        """The (kh, kw) float32 kernel (sum 1) when A is a convolution, else None."""
        return None

    @property
    def downsampling_factor(self) -> int | None:
        """The integer factor s when A downscales (H, W) to (H / s, W / s), else None."""
        return None

    def decomposition(self) -> Decomposition | None:
        """A = U diag(d) V^H where the operator has it (:mod:`~nfc_dps.operators.decomposition`),
        else None. The pseudo-inverse and the prox derive from it."""
        return None

    def gram_eigenvalues(self, h: int, w: int) -> Tensor | None:
        """The eigenvalues of A^T A on an (h, w) image (float64), or None when the operator does
        not declare them: h * w per channel, or C * h * w for an operator that mixes the channels.
        Default: the decomposition's |d|^2, in its coefficient order (FFT order, row-major, for a
        circulant operator); operators that override this give them in no particular order."""
        decomposition = self.decomposition()
        return None if decomposition is None else decomposition.gram_eigenvalues(h, w)

    def approximate_gram_eigenvalues(self, h: int, w: int) -> Tensor | None:
        """The eigenvalues of A^T A (h * w, or C * h * w for an operator that mixes channels) where they are declared
        (``gram_eigenvalues``), else an
        approximation of them (in no particular order) where the operator has one, else None.
        For uses that need only their distribution (a trace, a mean)."""
        return self.gram_eigenvalues(h, w)

    def image_region(self) -> tuple[int, int] | None:
        """(h, w) of the image inside a larger canvas when A sees only x[..., :h, :w], else None."""
        return None

    def measured_frame(self, image_shape: Sequence[int]) -> tuple[int, int, int, int] | None:
        """(top, left, height, width) of the region of an image of ``image_shape`` that the
        measurement lies over, where the image is larger than that region (a photograph's blur:
        the scene beyond the frame that the blur mixed in), else None."""
        return None

    def fitted(self, y: Tensor, callback: Any = None) -> "LinearOperator":
        """This operator with what it leaves unknown estimated from the measurement ``y`` (1, C, h, w)
        in [0, 1] (a blind blur's kernel: :class:`~nfc_dps.operators.blind.BlindBlur`), the
        restoration then runs on it; ``callback(step, steps)`` reports progress. Itself when nothing
        is unknown."""
        return self

    #: the measurement is an image (its noise level can be read from it: ``sigma_y="auto"``)
    image_measurement: bool = True
    #: the measurement holds no fine texture (a blur's): ``sigma_y="auto"`` reads every patch
    blurred_measurement: bool = False
    #: :meth:`fitted` estimates something of each measurement: a batch is fitted image by image
    fitted_per_image: bool = False
    #: how many times :func:`nfc_dps.restore` re-estimates it with :meth:`refined` and restores again
    refinements: int = 0
    #: the operator's own error (an estimated kernel's), in units of the measurement noise's std:
    #: :func:`nfc_dps.restore` restores as if that much independent Gaussian noise were added
    model_error: float = 0.0

    def measurement_noise(self) -> Any:
        """The noise model the measurement carries by construction (a JPEG file's quantisation
        error: :class:`~nfc_dps.operators.jpeg.JpegOperator`), a :class:`~nfc_dps.noise.NoiseModel`:
        :func:`nfc_dps.restore` uses it when no noise is given and refuses a stated one that
        contradicts it. None (the default): the noise is the caller's to state."""
        return None

    def consistent(self, x: Tensor, y: Tensor) -> Tensor:
        """The restoration ``x`` (B, C, H, W) in [0, 1] made consistent with the measurement ``y``
        where the measurement defines a set every image it can come from lies in (a JPEG file's
        quantisation cells: the projection onto them); :func:`nfc_dps.restore` applies it to its
        restorations and samples before clipping. ``x`` itself by default."""
        return x

    def refined(self, y: Tensor, x: Tensor) -> "LinearOperator":
        """This operator with what :meth:`fitted` estimated re-estimated from the measurement ``y``
        and a restoration ``x`` of it; itself when nothing is unknown."""
        return self

    def norm_bound(self) -> float | Tensor:
        """A bound on ||A||^2 for gradient step sizes: 1 (the built-in operators are normalised, and an
        operator of your own is taken to be); a (B,) tensor where it holds per-image parameters."""
        return 1.0

    def select_images(self, index: Tensor) -> "LinearOperator":
        """The operator of images ``index`` (a (n,) long tensor) of a batch: itself, unless it
        holds parameters per image (:class:`~nfc_dps.operators.weighted.WeightedOperator`)."""
        return self

    def describe(self) -> dict[str, Any]:
        """A JSON-able record of the operator: name, class, family and declared structure."""
        return {"name": self.name, "class": type(self).__name__, "family": self.family,
                "circulant": bool(self.is_circulant), "decomposable": self.decomposition() is not None}

    def A(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def A_adjoint(self, y: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        return self.A(x)

    def measurement_shape(self, image_shape: Sequence[int]) -> tuple[int, ...]:
        """Shape (B, C, h, w) of A x for an image of shape (B, C, H, W)."""
        raise NotImplementedError

    def image_shape(self, measurement_shape: Sequence[int]) -> tuple[int, ...]:
        """Shape of A^T y for a measurement of shape (B, C, h, w)."""
        raise NotImplementedError

    def A_pinv(self, y: Tensor) -> Tensor:
        """Pseudo-inverse: from the decomposition where there is one (V(U^H y / d), the smallest
        singular values dropped: :meth:`Decomposition.pinv`), else the prox at r = 1e4, sigma_y = 1
        from 0 (conjugate gradients unless the operator has a closed-form prox)."""
        decomposition = self.decomposition()
        if decomposition is not None:
            check_image(y, "y")
            return decomposition.pinv(y)
        return self.prox(y, torch.zeros(self.image_shape(y.shape), dtype=y.dtype, device=y.device), 1.0, 1e4)

    def normal(self, x: Tensor) -> Tensor:
        """A^T A x."""
        return self.A_adjoint(self.A(x))

    def prox(self, y: Tensor, z: Tensor, sigma_y: float | Tensor, r: float | Tensor,
             max_iter: int = 100, tol: float = 1e-6) -> Tensor:
        """argmin_x ||y - A x||^2 / (2 sigma_y^2) + ||x - z||^2 / (2 r^2).

        In closed form from the decomposition where there is one (exact; r = inf allowed: the
        least-squares solution closest to z; max_iter and tol unused), else by
        :func:`normal_equations_prox`.
        """
        decomposition = self.decomposition()
        if decomposition is None:
            return normal_equations_prox(self, y, z, sigma_y, r, max_iter, tol)
        check_image(y, "y")
        check_image(z, "z")
        if tuple(y.shape) != tuple(self.measurement_shape(z.shape)):
            raise ValueError(f"y {tuple(y.shape)} is not the measurement of z {tuple(z.shape)} for this operator")
        s2, r2 = prox_scales(sigma_y, r, z)
        return decomposition.gaussian_mean(y, z, s2, r2)

    def measure(self, x: Tensor, sigma_y: float | Tensor | None = None,
                generator: torch.Generator | Sequence[torch.Generator] | None = None, *, noise: Any = None) -> Tensor:
        """A x plus noise drawn per image from ``generator`` (see randn_per_image): Gaussian of std
        ``sigma_y`` (a float or a (B,) tensor, per image, >= 0), or from a noise model ``noise``
        (:mod:`nfc_dps.noise`: ``PoissonNoise(30)``, a spec such as ``"poisson:30"``); one of the two.
        """
        check_image(x)
        if (sigma_y is None) == (noise is None):
            raise TypeError("measure() takes one of sigma_y (Gaussian std) and noise (a noise model)")
        ax = self.A(x)
        if noise is not None:
            return as_noise(noise).sample(ax, generator)
        s = per_image(sigma_y, ax)
        if not bool(torch.isfinite(s).all()) or bool((s < 0).any()):
            raise ValueError(f"sigma_y must be finite and >= 0, got {_describe(sigma_y)}")
        if not bool((s > 0).any()):
            return ax
        return ax + s * randn_per_image(ax.shape, generator, ax.dtype, ax.device)


def normal_equations_prox(operator: LinearOperator, y: Tensor, z: Tensor, sigma_y: float | Tensor,
                          r: float | Tensor, max_iter: int = 100, tol: float = 1e-6) -> Tensor:
    """argmin_x ||y - A x||^2 / (2 sigma_y^2) + ||x - z||^2 / (2 r^2) by conjugate gradients, for any operator.

    Solves (A^T A / sigma_y^2 + I / r^2) x = A^T y / sigma_y^2 + z / r^2 per image, from x = z,
    until the residual is below ``tol`` times the right-hand side or for ``max_iter``
    iterations. The condition number is about 1 + r^2 ||A^T A|| / sigma_y^2: for r >> sigma_y
    (a reflect-boundary blur at r = 50, sigma_y = 0.05 on 64 px) 100 iterations stop well short
    of the minimum, and the result is an early-stopped solve (which regularises, like a
    smaller r) rather than the exact minimiser; pass a larger ``max_iter`` to get closer.
    """
    s2, r2 = prox_scales(sigma_y, r, z)
    rhs = operator.A_adjoint(y) / s2 + z / r2
    return conjugate_gradient(lambda v: operator.normal(v) / s2 + v / r2, rhs, z.clone(), max_iter, tol)


def conjugate_gradient(apply, b: Tensor, x0: Tensor, max_iter: int = 100, tol: float = 1e-6,
                       precondition=None) -> Tensor:
    """Solve apply(x) = b for a symmetric positive definite ``apply``, independently per image.

    ``precondition``: optional SPD approximation of apply's inverse (preconditioned CG). Each image
    stops when its residual norm is below tol * ||b|| (the loop when every image has, or after
    ``max_iter`` iterations), so its result is the one it would get alone. Shapes (B, ...).
    """
    def dot(a: Tensor, c: Tensor) -> Tensor:
        return (a * c).flatten(1).sum(1).view(-1, *([1] * (a.ndim - 1)))

    tiny = torch.finfo(b.dtype).tiny  # floor of the divisions, the dtype's smallest normal number
    x = x0
    r = b - apply(x)
    z = r if precondition is None else precondition(r)
    p = z.clone()
    rr, rz = dot(r, r), dot(r, z)
    b_norm2 = dot(b, b).clamp_min(tiny)
    for _ in range(max_iter):
        # an image that has converged stops there (its step is 0), as it would alone: a result
        # never depends on the other images of the batch
        active = rr > (tol**2) * b_norm2
        if not bool(active.any()):
            break
        ap = apply(p)
        alpha = torch.where(active, rz / dot(p, ap).clamp_min(tiny), torch.zeros_like(rz))
        x = x + alpha * p
        r = r - alpha * ap
        z = r if precondition is None else precondition(r)
        rr, rz_new = dot(r, r), dot(r, z)
        p = z + (rz_new / rz.clamp_min(tiny)) * p
        rz = rz_new
    return x


def pixel_gain(operator: LinearOperator, like: Tensor) -> Tensor:
    """g = A^T A 1, shaped like ``like`` (B, C, H, W): the weight the measurement puts on each
    pixel (the mask for inpainting, 1/s^2 for SR x s, sum k^2 for blur); 0 = unobserved."""
    return operator.A_adjoint(operator.A(torch.ones_like(like)))
