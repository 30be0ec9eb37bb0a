"""The prior interface: a denoiser ``D(x, sigma) -> x0_hat`` in the VE/EDM sigma parameterisation.

Units. ``x`` is in the model range [-1, 1] plus Gaussian noise of standard deviation ``sigma``
(per batch element, same units). ``D`` returns the MMSE estimate of the clean image, also in
[-1, 1] units. A prior knows nothing of measurements; a sampler knows nothing of networks.

Network wrappers (``EpsilonDenoiser``, ``EDMDenoiser``) adapt a raw network once:

* a discrete DDPM network with ``alphas_cumprod`` sees ``x_t = x / sqrt(1 + sigma^2)`` and a
  (fractional) timestep ``t(sigma)`` interpolated in log-sigma between its training steps;
  epsilon-, v- and x0-prediction are converted to ``x0_hat``; learned-variance channels are
  dropped;
* an EDM-preconditioned network (the embedded default prior) uses Karras et al.'s c_skip,
  c_out, c_in and c_noise = 250 ln(sigma) (the DDPM timestep scale of the sinusoidal embedding).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from typing import Callable, ContextManager

import torch
from torch import Tensor, nn

from ..frequency import power_law_spectrum

PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")


def as_sigma_tensor(sigma: float | Tensor, x: Tensor) -> Tensor:
    """Broadcast ``sigma`` (float, 0-d or (B,)) to a float tensor of shape (B,) on x's device."""
    sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device)
    if sigma.ndim == 0:
        sigma = sigma.expand(x.shape[0])
    if sigma.shape != (x.shape[0],):
        raise ValueError(f"sigma must be a scalar or have shape ({x.shape[0]},), got {tuple(sigma.shape)}")
    return sigma


def network_grad(x: Tensor, network: object = None) -> ContextManager:
    """The autograd context of one network call on ``x``: gradients only where a caller needs
    them, ``torch.no_grad()`` otherwise.

    Gradients stay on when autograd is enabled and ``x`` requires grad (DPS differentiates the
    network's output with respect to its input), or when ``network`` is an ``nn.Module`` in
    training mode (a training loop differentiates with respect to its weights); a network in
    ``.eval()`` or a plain function called by a sampler builds no graph and keeps no activations.
    """
    if torch.is_grad_enabled() and (x.requires_grad or (isinstance(network, nn.Module) and network.training)):
        return contextlib.nullcontext()
    return torch.no_grad()


def prior_device(prior: nn.Module) -> torch.device | None:
    """Where ``prior`` runs, for ``restore`` to move measurements there: its ``device`` attribute
    when it sets one, else where its first parameter or buffer lives; None when it holds no
    tensor (it then runs on whatever device its input is on)."""
    declared = getattr(prior, "device", None)
    if isinstance(declared, (str, torch.device)):
        return torch.device(declared)
    if not isinstance(prior, nn.Module):
        return None
    for t in itertools.chain(prior.parameters(), prior.buffers()):
        return t.device
    return None


class Prior(nn.Module):
    """Abstract denoiser. Subclasses implement :meth:`denoise`.

    Attributes:
        channels: number of image channels the prior models (3 for RGB).
        sigma_min, sigma_max: noise range (model units) the denoiser was trained for.
        size_multiple: H and W must be multiples of this (1 = any size).
        denoiser_only: False for a diffusion prior, whose ``sigma_max`` drowns the image (a
            schedule that asks for more starts there); True for a Gaussian denoiser valid up to
            ``sigma_max`` only (``DenoiserPrior``): a sampler whose schedule would call it above
            refuses before it starts (``samplers.common.schedule_top``).
    """

    channels: int = 3
    sigma_min: float = 0.002
    sigma_max: float = 80.0
    size_multiple: int = 1
    #: optional (amplitude, alpha): the data's power spectrum S = amplitude * r^-alpha per ortho
    #: Fourier coefficient in model units, r the normalised radius (nfc_dps.frequency)
    power_law: tuple[float, float] | None = None
    #: the network's compute precision, "float32" or "bfloat16" (set by the loaders)
    precision: str = "float32"
    #: a denoiser without diffusion noise levels (see the class docstring)
    denoiser_only: bool = False

    @property
    def fixed_size(self) -> tuple[int, int] | None:
        """(H, W) when the prior takes images of that one size only (the Gaussian oracles), else
        None; wrappers answer for the prior they wrap."""
        inner = getattr(self, "inner", None)
        return inner.fixed_size if isinstance(inner, Prior) else None

    @property
    def spectrum_is_exact(self) -> bool:
        """True when ``spectrum`` is the prior's exact power spectrum (a Gaussian prior's, which
        overrides this), not a power law fitted to training images; wrappers answer for the
        prior they wrap, as ``spectrum`` does."""
        inner = getattr(self, "inner", None)
        return self.power_law is None and isinstance(inner, Prior) and inner.spectrum_is_exact

    def spectrum(self, h: int, w: int) -> Tensor:
        """(h, w) power spectrum of the prior's images, from ``power_law`` (or a wrapped prior's)."""
        if self.power_law is not None:
            amplitude, alpha = (torch.tensor([float(v)], dtype=torch.float64) for v in self.power_law)
            return power_law_spectrum(amplitude, alpha, (h, w))[0, 0]
        inner = getattr(self, "inner", None)
        if isinstance(inner, Prior):
            return inner.spectrum(h, w)
        raise NotImplementedError(f"{type(self).__name__} declares no power spectrum (power_law is None)")

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        """(B, C, H, W) noisy image, (B,) sigma -> (B, C, H, W) estimate of the clean image."""
        raise NotImplementedError

    def forward(self, x: Tensor, sigma: float | Tensor) -> Tensor:
        self.check_input(x)
        return self.denoise(x, as_sigma_tensor(sigma, x))

    def check_input(self, x: Tensor) -> None:
        if x.ndim != 4:
            raise ValueError(f"prior input must be (B, C, H, W), got shape {tuple(x.shape)}")
        if x.shape[1] != self.channels:
            raise ValueError(
                f"prior models {self.channels}-channel images, got {x.shape[1]} channels "
                f"(convert gray/RGBA images before sampling)"
            )
        m = self.size_multiple
        if x.shape[-2] % m or x.shape[-1] % m:
            raise ValueError(f"image size {tuple(x.shape[-2:])} must be a multiple of {m} for this prior; pad first")


class EDMDenoiser(Prior):
    """Karras et al. (2022) preconditioning around a network ``F(x_in, c_noise) -> (B, C, H, W)``.

    D(x, sigma) = c_skip x + c_out F(c_in x, c_noise), with sigma_data = 0.5 for [-1, 1] data.
    """

    def __init__(
        self,
        network: Callable[[Tensor, Tensor], Tensor],
        channels: int = 3,
        sigma_data: float = 0.5,
        sigma_min: float = 0.002,
        sigma_max: float = 80.0,
        size_multiple: int = 1,
    ) -> None:
        super().__init__()
        self.network = network
        self.channels, self.sigma_data = channels, sigma_data
        self.sigma_min, self.sigma_max, self.size_multiple = sigma_min, sigma_max, size_multiple

    @staticmethod
    def c_noise(sigma: Tensor) -> Tensor:
        """Noise code fed to the timestep embedding: 250 ln(sigma) (DDPM-step scale)."""
        return 250.0 * sigma.clamp_min(1e-8).log()

    def scalings(self, sigma: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        sd2 = self.sigma_data**2
        c_skip = sd2 / (sigma**2 + sd2)
        c_out = sigma * self.sigma_data / (sigma**2 + sd2).sqrt()
        c_in = 1.0 / (sigma**2 + sd2).sqrt()
        return c_skip, c_out, c_in

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        c_skip, c_out, c_in = (c.view(-1, 1, 1, 1) for c in self.scalings(sigma))
        with network_grad(x, self.network):
            out = self.network(x * c_in, self.c_noise(sigma))
        return c_skip * x + c_out * out[:, : self.channels]


class EpsilonDenoiser(Prior):
    """Adapts a discrete-time DDPM network ``net(x_t, t) -> output`` to ``D(x, sigma)``.

    Args:
        network: callable (B, C, H, W) x_t, (B,) float timestep -> (B, C' , H, W) with C' >= C.
        alphas_cumprod: (T,) the training schedule's cumulative alphas.
        prediction_type: "epsilon", "v_prediction" or "sample" (x0).
        channels: image channels; extra output channels (learned variance) are dropped.
    """

    def __init__(
        self,
        network: Callable[[Tensor, Tensor], Tensor],
        alphas_cumprod: Tensor,
        prediction_type: str = "epsilon",
        channels: int = 3,
        size_multiple: int = 1,
    ) -> None:
        super().__init__()
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
        self.network = network
        self.prediction_type, self.channels, self.size_multiple = prediction_type, channels, size_multiple
        alphas_cumprod = torch.as_tensor(alphas_cumprod, dtype=torch.float64)
        sigmas = ((1 - alphas_cumprod) / alphas_cumprod).sqrt()
        self.register_buffer("log_sigmas", sigmas.log().float(), persistent=False)
        self.sigma_min, self.sigma_max = float(sigmas[0]), float(sigmas[-1])

    def sigma_to_t(self, sigma: Tensor) -> Tensor:
        """Fractional timestep: linear interpolation of log-sigma between discrete steps (clamped)."""
        log_sigmas = self.log_sigmas.to(sigma.device)
        # same dtype as the table (searchsorted needs it; the table follows .double()/.float())
        log_sigma = sigma.detach().to(log_sigmas.dtype).clamp_min(1e-10).log()
        idx = torch.searchsorted(log_sigmas, log_sigma).clamp(1, len(log_sigmas) - 1)
        lo, hi = log_sigmas[idx - 1], log_sigmas[idx]
        w = ((log_sigma - lo) / (hi - lo)).clamp(0, 1)
        return ((idx - 1).to(w.dtype) + w).float()

    def t_to_sigma(self, t: Tensor) -> Tensor:
        """Inverse of :meth:`sigma_to_t` (log-sigma interpolation between steps, clamped to [0, T-1])."""
        log_sigmas = self.log_sigmas.to(t.device)
        t = t.to(log_sigmas.dtype).clamp(0, len(log_sigmas) - 1)
        lo = t.floor().long()
        hi = (lo + 1).clamp_max(len(log_sigmas) - 1)
        w = t - lo
        return ((1 - w) * log_sigmas[lo] + w * log_sigmas[hi]).exp()

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        s = sigma.view(-1, 1, 1, 1).to(x.dtype)
        alpha = 1.0 / (1.0 + s**2).sqrt()  # sqrt(alphā_t)
        x_t = x * alpha
        with network_grad(x, self.network):
            out = self.network(x_t, self.sigma_to_t(sigma))[:, : self.channels]
        return prediction_to_x0(out, x_t, alpha, s * alpha, self.prediction_type)


def prediction_to_x0(out: Tensor, x_t: Tensor, alpha: Tensor, sigma_vp: Tensor, prediction_type: str) -> Tensor:
    """Convert a VP network output to x0 given x_t = alpha x0 + sigma_vp eps (alpha^2 + sigma_vp^2 = 1)."""
    if prediction_type == "epsilon":
        return (x_t - sigma_vp * out) / alpha
    if prediction_type == "v_prediction":  # v = alpha eps - sigma_vp x0
        return alpha * x_t - sigma_vp * out
    if prediction_type == "sample":
        return out
    raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")


def x0_to_prediction(x0: Tensor, eps: Tensor, alpha: Tensor, sigma_vp: Tensor, prediction_type: str) -> Tensor:
    """Inverse of :func:`prediction_to_x0`: the target a network of ``prediction_type`` would output."""
    if prediction_type == "epsilon":
        return eps
    if prediction_type == "v_prediction":
        return alpha * eps - sigma_vp * x0
    if prediction_type == "sample":
        return x0
    raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")


class PriorWrapper(Prior):
    """A prior around another one (``inner``): it answers for the inner prior's channels, noise
    range (and whether it is a denoiser only), size multiple and precision (``spectrum`` and ``spectrum_is_exact`` defer to ``inner``
    already); a subclass overrides :meth:`denoise`, which passes the call through here."""

    def __init__(self, inner: Prior) -> None:
        super().__init__()
        self.inner = inner
        self.channels, self.sigma_min, self.sigma_max = inner.channels, inner.sigma_min, inner.sigma_max
        self.size_multiple, self.precision = inner.size_multiple, inner.precision
        self.denoiser_only = inner.denoiser_only

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        return self.inner.denoise(x, sigma)


class TiledPrior(PriorWrapper):
    """Applies a prior tile by tile at the size it was trained at.

    A network with GroupNorm sees different statistics at another image size (docs/prior.md, "Why
    tiles of 48"). Each axis longer than a tile is covered by the fewest ``tile``-sized tiles whose
    neighbours overlap by at least ``tile // 8`` pixels (before the moves below), the first and last
    flush with the image's edges; the tiles are denoised as one batch and blended back with linear
    cross-fades over each overlap (normalised to sum to one), so no pixel sits on a hard seam. With
    three or more tiles on an axis the inner ones move with sigma by up to half an overlap (the
    seams move from one noise level to the next, yet a call is deterministic and independent of the
    batch); two tiles keep their one cross-fade in place. An axis no longer than a tile is one tile,
    reflect-padded at an offset that depends on sigma. With ``overlap=True`` four half-shifted grids
    are blended with raised-cosine weights instead (about 4x the cost).

    Tiles go through the network at most ``max_tiles`` at a time, so the network's activations,
    not the image size, bound the memory of one call.
    """

    def __init__(self, inner: Prior, tile: int, overlap: bool = False, max_tiles: int = 128) -> None:
        if max_tiles < 1:
            raise ValueError(f"max_tiles must be >= 1, got {max_tiles}")
        if tile < 1 or tile % inner.size_multiple:
            raise ValueError(f"tile {tile} must be a positive multiple of {inner.size_multiple}, the image-size "
                             f"multiple of the network it tiles")
        super().__init__(inner)
        self.tile, self.overlap, self.max_tiles = int(tile), overlap, int(max_tiles)
        self.size_multiple = 1  # every tile has the tile's size, a multiple of the inner prior's

    def tiles_along(self, n: int) -> int:
        """Number of tiles covering an axis of ``n`` pixels (see the class docstring)."""
        t = self.tile
        least_overlap = min(max(1, t // 8), t - 1)
        return 1 if n <= t else -(-(n - least_overlap) // (t - least_overlap))

    @staticmethod
    def _sigma_hash(sigma: float, axis: int) -> int:
        """A deterministic integer in [0, 2**32) that changes with sigma: Knuth's multiplicative hash of
        log sigma; axis 1 takes other bits of it (divided by a prime) than axis 0."""
        code = int(abs(math.log(max(sigma, 1e-12))) * 1e6) * 2654435761 % (2**32)
        return code if axis == 0 else code // 7919

    def layout(self, n: int, sigma: float, axis: int = 0) -> tuple[int, list[int], list[Tensor]]:
        """How an axis of ``n`` pixels is tiled at noise level ``sigma``: (reflect padding before the
        image, each tile's first pixel on the padded axis, each tile's blending weights over its
        ``tile`` pixels, float64). ``axis``: 0 for rows, 1 for columns (each takes its move from
        other bits of the sigma hash)."""
        t = self.tile
        code = self._sigma_hash(sigma, axis)
        if n <= t:
            return code % (t - n + 1), [0], [torch.ones(t, dtype=torch.float64)]
        count = self.tiles_along(n)
        reach = int((t - (n - t) / (count - 1)) // 2) if count > 2 else 0  # half the overlap
        move = code % (2 * reach + 1) - reach
        starts = [0] + [round(i * (n - t) / (count - 1)) + move for i in range(1, count - 1)] + [n - t]
        pixel_centres = torch.arange(t, dtype=torch.float64) + 0.5
        weights = []
        for i, start in enumerate(starts):
            w = torch.ones(t, dtype=torch.float64)
            if i > 0:  # rises across the overlap with the tile before
                w = torch.minimum(w, pixel_centres / (starts[i - 1] + t - start))
            if i < count - 1:  # falls across the overlap with the tile after
                w = torch.minimum(w, (t - pixel_centres) / (start + t - starts[i + 1]))
            weights.append(w)
        return 0, starts, weights

    def _network(self, tiles: Tensor, sigma: Tensor) -> Tensor:
        """The inner prior on a batch of tiles, ``max_tiles`` at a time."""
        if tiles.shape[0] <= self.max_tiles:
            return self.inner.denoise(tiles, sigma)
        return torch.cat([self.inner.denoise(tiles[i:i + self.max_tiles], sigma[i:i + self.max_tiles])
                          for i in range(0, tiles.shape[0], self.max_tiles)])

    def _blend(self, x: Tensor, sigma: Tensor) -> Tensor:
        """Denoise ``x`` (B, C, H, W) at one noise level (``sigma``: (B,), all equal) on its blended
        tiles; returns (B, C, H, W) in x's dtype, accumulated in at least float32."""
        b, c, h, w = x.shape
        t = self.tile
        pad_y, ys, wys = self.layout(h, float(sigma[0]), 0)
        pad_x, xs, wxs = self.layout(w, float(sigma[0]), 1)
        hp, wp = max(h, t), max(w, t)
        xp = reflect_pad(x, pad_y, hp - h - pad_y, pad_x, wp - w - pad_x)
        corners = [(y0, x0) for y0 in ys for x0 in xs]
        tiles = torch.stack([xp[..., y0:y0 + t, x0:x0 + t] for y0, x0 in corners], dim=1)
        out = self._network(tiles.reshape(-1, c, t, t), sigma.repeat_interleave(len(corners)))
        out = out.reshape(b, len(corners), c, t, t)
        dtype = torch.promote_types(out.dtype, torch.float32)
        weights = torch.stack([wy[:, None] * wx[None, :] for wy in wys for wx in wxs]).to(out.device, dtype)
        total_y, total_x = torch.zeros(hp, dtype=torch.float64), torch.zeros(wp, dtype=torch.float64)
        for y0, wy in zip(ys, wys):
            total_y[y0:y0 + t] += wy
        for x0, wx in zip(xs, wxs):
            total_x[x0:x0 + t] += wx
        acc = torch.zeros(b, c, hp, wp, dtype=dtype, device=out.device)
        for i, (y0, x0) in enumerate(corners):
            acc[..., y0:y0 + t, x0:x0 + t] += out[:, i].to(dtype) * weights[i]
        acc = acc / (total_y[:, None] * total_x[None, :]).to(out.device, dtype)
        return acc[..., pad_y:pad_y + h, pad_x:pad_x + w].to(out.dtype)

    def _grid(self, x: Tensor, sigma: Tensor, oy: int, ox: int, ny: int, nx: int) -> Tensor:
        """Denoise on the ny x nx tile grid whose origin lies (oy, ox) pixels before the image's."""
        b, c, h, w = x.shape
        t = self.tile
        xp = reflect_pad(x, oy, ny * t - h - oy, ox, nx * t - w - ox)
        tiles = xp.reshape(b, c, ny, t, nx, t).permute(0, 2, 4, 1, 3, 5).reshape(b * ny * nx, c, t, t)
        out = self._network(tiles, sigma.repeat_interleave(ny * nx))
        out = out.reshape(b, ny, nx, c, t, t).permute(0, 3, 1, 4, 2, 5).reshape(b, c, ny * t, nx * t)
        return out[..., oy : oy + h, ox : ox + w]

    def denoise(self, x: Tensor, sigma: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        t = self.tile
        if h == t and w == t and not self.overlap:
            return self.inner.denoise(x, sigma)
        if self.overlap:
            half = t // 2
            win = torch.sin(torch.pi * (torch.arange(t, device=x.device, dtype=x.dtype) + 0.5) / t) ** 2
            acc = torch.zeros_like(x)
            norm = torch.zeros_like(x[:1, :1])
            for oy in (0, half):
                for ox in (0, half):
                    wy = win[(torch.arange(h, device=x.device) + oy) % t]
                    wx = win[(torch.arange(w, device=x.device) + ox) % t]
                    weight = wy[:, None] * wx[None, :]
                    ny, nx = -(-(h + oy) // t), -(-(w + ox) // t)
                    acc = acc + self._grid(x, sigma, oy, ox, ny, nx) * weight
                    norm = norm + weight
            return acc / norm
        out = torch.empty_like(x)
        for s in sigma.unique():
            sel = (sigma == s).nonzero().flatten()
            out[sel] = self._blend(x[sel], sigma[sel])
        return out


def reflect_index(n: int, before: int, after: int, device: torch.device | str | None = None) -> Tensor:
    """Source indices of a reflect padding ("d c b | a b c d | c b a") of a length-``n`` axis.

    Pads may exceed the axis: the reflection continues periodically (period 2(n-1)), as numpy's
    ``np.pad(mode="reflect")``. A length-1 axis is replicated.
    """
    i = torch.arange(-before, n + after, device=device)
    if n == 1:
        return torch.zeros_like(i)
    period = 2 * (n - 1)
    m = i.remainder(period)
    return torch.where(m < n, m, period - m)


def reflect_pad(x: Tensor, top: int, bottom: int, left: int, right: int) -> Tensor:
    """Reflect padding (edge not repeated) of the last two axes, for pads of any size.

    Equals ``np.pad(x, ..., mode="reflect")``: pads larger than the image continue the reflection
    periodically; a 1-pixel axis is replicated. Differentiable (an index gather).
    """
    if min(top, bottom, left, right) < 0:
        raise ValueError(f"pads must be >= 0, got {(top, bottom, left, right)}")
    h, w = x.shape[-2:]
    if top or bottom:
        x = x.index_select(-2, reflect_index(h, top, bottom, x.device))
    if left or right:
        x = x.index_select(-1, reflect_index(w, left, right, x.device))
    return x
