"""Textured dead leaves: procedural training images with photographic statistics.

The flat dead-leaves model (:func:`nfc_dps.priors.training_data.dead_leaves`: occluding disks of
one colour each, radii ~ r^-3, so a power spectrum ~ |omega|^-2) extended along the lines of
VibrantLeaves (Achddou, Gousseau, Ladjal, Süsstrunk, arXiv 2504.10201), which showed that
denoising and super-resolution networks trained only on such images come close to ones trained on
photographs. :func:`textured_leaves` draws, from one ``numpy.random.Generator``:

* **geometry**: disks, rotated ellipses and rotated rectangles, radii ~ r^-3 in [r_min, r_max],
  uniform positions, front to back; a pixel shows the front-most leaf covering it (the leaves are
  rasterised at once, grouped by size: a scatter-min of leaf indices), and pixels no leaf covers
  show one background leaf;
* **colour**: a per-image palette in an opponent colour space (mean of R, G, B; red-green;
  yellow-blue): a few dominant colours, broad in luma and narrow in chroma around a random cast,
  some images nearly gray; each leaf takes one palette colour with a small jitter;
* **texture** (per leaf, vectorised by gathering each pixel's leaf parameters): a sinusoidal grating
  of random frequency, orientation, phase and sharpness (a soft square wave), a Gaussian
  random field with a power-law spectrum |omega|^-beta (beta in [1.5, 3.5], a few fields per
  image, shifted per leaf) and a linear shading, mixed along the colour difference to a second
  palette colour and along luma;
* **depth of field** (with probability ``dof``): the leaves fall into three depth layers by their
  order, one layer is in focus and the others get a Gaussian blur growing with their distance to
  it, composited back to front (a blurred front layer spreads over what lies behind it);
* **acquisition**: a mild optical blur and sensor-like noise (std sqrt(a x + b^2)), each with
  its probability, then a random gamma and contrast.

Everything is a function of the generator's draws: the same seed gives the same image. Values
are float32 (H, W, 3) in [0, 1]; :class:`nfc_dps.training.data.DeadLeaves` converts to gray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage

from ..priors.training_data import dead_leaves

#: the procedural generators of ``train-prior --synthetic``
SYNTHETIC = ("dead_leaves", "textured")
DEFAULT_SYNTHETIC = "dead_leaves"

# RGB = luma * (1, 1, 1) + rg * (1, -1, 0) / sqrt 2 + yb * (1, 1, -2) / sqrt 6
_OPPONENT_TO_RGB = np.array([[1.0, 1 / np.sqrt(2), 1 / np.sqrt(6)],
                             [1.0, -1 / np.sqrt(2), 1 / np.sqrt(6)],
                             [1.0, 0.0, -2 / np.sqrt(6)]], np.float32)


# chroma spreads (red-green, yellow-blue): photographs vary more along yellow-blue (daylight, shade)
_CHROMA = np.array([0.6, 1.0])


@dataclass(frozen=True)
class LeavesParams:
    """Settings of :func:`textured_leaves` (probabilities are per image unless noted)."""

    r_min: float = 3.0  # leaf radii ~ r^-3 in [r_min, r_max] pixels
    r_max: float = 96.0
    coverage: float = 4.0  # leaves drawn: this many times the image area over the mean leaf area
    max_leaves: int = 8000
    shapes: tuple[float, float, float] = (0.4, 0.3, 0.3)  # disk, ellipse, rectangle
    textured: float = 0.75  # probability that a leaf carries a grating or a noise texture
    dof: float = 0.5  # depth of field
    dof_sigma: float = 2.0  # largest blur per layer of defocus, pixels
    optics: float = 0.5  # a Gaussian optical blur, std uniform in optics_sigma
    optics_sigma: tuple[float, float] = (0.3, 0.9)
    noise: float = 0.25  # sensor-like noise; read-noise std up to noise_std ([0, 1] units)
    noise_std: float = 0.01
    tone: bool = True  # random gamma and contrast


DEFAULT_PARAMS = LeavesParams()


def _leaf_geometry(rng: np.random.Generator, size: int, p: LeavesParams) -> dict:
    """Per-leaf shapes and positions, front-most first; as many leaves as cover the image
    ``coverage`` times over on average (so few pixels show the background leaf)."""
    mean_r2 = np.log(p.r_max / p.r_min) / (0.5 * (p.r_min**-2 - p.r_max**-2))  # E[r^2] under r^-3
    n = int(min(p.max_leaves, np.ceil(p.coverage * size * size / (np.pi * mean_r2 * 0.7))))
    u = rng.random(n)
    r = 1.0 / np.sqrt(u / p.r_min**2 + (1 - u) / p.r_max**2)
    shape = rng.choice(3, n, p=np.asarray(p.shapes) / sum(p.shapes))
    aspect = np.where(shape == 0, 1.0, rng.uniform(0.25, 1.0, n))
    theta = rng.uniform(0, np.pi, n)
    cy, cx = rng.uniform(-0.5 * r, size + 0.5 * r, (2, n))
    return {"n": n, "r": r, "shape": shape, "aspect": aspect, "theta": theta, "cy": cy, "cx": cx}


def _label_map(g: dict, size: int) -> np.ndarray:
    """(size, size) int64: index of the front-most leaf covering each pixel; ``n`` where none does.

    Leaves are grouped by their bounding half-extent (in half octaves); each group is tested on
    its own pixel grid around the leaf centres and written with a scatter-min of indices (the
    front-most leaf has the smallest index), so no Python loop runs over leaves.
    """
    n = g["n"]
    label = torch.full((size * size,), n, dtype=torch.int64)
    half = g["r"] * np.maximum(1.0, 0.8 * np.sqrt(1 + g["aspect"] ** 2)) + 1  # covers ellipses and rectangles
    bucket = np.ceil(2 * np.log2(np.maximum(half, 1.0))).astype(int)  # half-octaves
    cos, sin = np.cos(g["theta"]), np.sin(g["theta"])
    for b in np.unique(bucket):
        idx = np.flatnonzero(bucket == b)
        h = int(np.ceil(2 ** (b / 2)))
        off = np.arange(-h, h + 1, dtype=np.float32)
        cy, cx = g["cy"][idx, None, None].astype(np.float32), g["cx"][idx, None, None].astype(np.float32)
        y, x = np.round(cy) + off[None, :, None], np.round(cx) + off[None, None, :]  # (k, 2h+1, 1), (k, 1, 2h+1)
        dy, dx = y - cy, x - cx
        c, s = (cos[idx, None, None] / g["r"][idx, None, None]).astype(np.float32), \
            (sin[idx, None, None] / g["r"][idx, None, None]).astype(np.float32)
        ia = (1.0 / g["aspect"][idx, None, None]).astype(np.float32)
        a, bb = dx * c + dy * s, (dy * c - dx * s) * ia
        rect = (g["shape"][idx] == 2)[:, None, None]
        inside = np.where(rect, np.maximum(np.abs(a), np.abs(bb)) <= 0.8, a * a + bb * bb <= 1.0)
        inside &= (y >= 0) & (y < size) & (x >= 0) & (x < size)
        k, i, j = np.nonzero(inside)
        pix = (y[k, i, 0] * size + x[k, 0, j]).astype(np.int64)
        label.scatter_reduce_(0, torch.from_numpy(pix), torch.from_numpy(idx[k].astype(np.int64)), "amin")
    return label.view(size, size).numpy()


def _palette(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 3) base colours and (n, 3) second colours (RGB in [0, 1]) from one image's palette."""
    k = int(rng.integers(2, 7))
    sat = 0.0 if rng.random() < 0.15 else rng.uniform(0.02, 0.15)
    cast = rng.normal(0.0, 0.06, 2) * _CHROMA * (sat > 0)
    centres = np.column_stack([rng.beta(1.6, 1.8, k) * 0.9 + 0.05, cast + rng.normal(0.0, sat, (k, 2)) * _CHROMA])

    def draw() -> np.ndarray:
        c = centres[rng.integers(k, size=n)]
        c = c + rng.normal(0.0, 1.0, (n, 3)) * np.array([0.1, *(_CHROMA * sat / 3)])
        return np.clip(c.astype(np.float32) @ _OPPONENT_TO_RGB.T, 0.0, 1.0)

    return draw(), draw()


def _noise_fields(rng: np.random.Generator, size: int, count: int = 4) -> np.ndarray:
    """(count, size, size) periodic Gaussian fields, power spectra |omega|^-beta, unit std."""
    f = np.fft.fftfreq(size)
    rad = np.sqrt(f[:, None] ** 2 + f[None, : size // 2 + 1] ** 2)
    rad[0, 0] = 1.0
    beta = rng.uniform(1.5, 3.5, count)
    spec = np.fft.rfft2(rng.standard_normal((count, size, size)))
    spec *= rad[None] ** (-beta[:, None, None] / 2)
    spec[:, 0, 0] = 0.0
    fields = np.fft.irfft2(spec, s=(size, size))
    return (fields / fields.std(axis=(1, 2), keepdims=True)).astype(np.float32)


def _leaf_textures(rng: np.random.Generator, n: int, p: LeavesParams) -> dict:
    """Per-leaf texture parameters (grating, noise field, shading amplitudes and their settings)."""
    textured = rng.random(n) < p.textured
    grating = textured & (rng.random(n) < 0.4)
    return {
        "grating": grating * rng.uniform(0.0, 1.0, n) ** 2 * 0.6,
        "noise": (textured & ~grating | (textured & (rng.random(n) < 0.3))) * rng.uniform(0.0, 1.0, n) ** 2 * 0.8,
        "freq": np.exp(rng.uniform(np.log(1 / 40), np.log(1 / 2.5), n)),
        "angle": rng.uniform(0, np.pi, n),
        "phase": rng.uniform(0, 2 * np.pi, n),
        "sharp": np.exp(rng.uniform(0.0, np.log(6.0), n)),
        "field": rng.integers(4, size=n),
        "oy": rng.integers(1 << 16, size=n),
        "ox": rng.integers(1 << 16, size=n),
        "shade": rng.normal(0.0, 0.15, (n, 2)),
        "luma": rng.uniform(0.0, 0.5, n),  # share of the texture along luma (rest: along the colour pair)
    }


def _render(rng: np.random.Generator, g: dict, label: np.ndarray, size: int, p: LeavesParams) -> np.ndarray:
    """The sharp image: each pixel its leaf's colour plus texture (per-pixel gathers of leaf parameters)."""
    n = g["n"] + 1  # the background leaf last
    base, second = _palette(rng, n)
    t = _leaf_textures(rng, n, p)
    fields = _noise_fields(rng, size)
    cy, cx = np.append(g["cy"], size / 2), np.append(g["cx"], size / 2)
    r = np.append(g["r"], size)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    dy, dx = yy - cy[label], xx - cx[label]
    ang = t["angle"][label]
    u = dx * np.cos(ang) + dy * np.sin(ang)
    wave = np.sin(2 * np.pi * t["freq"][label] * u + t["phase"][label])
    sharp = t["sharp"][label]
    wave = np.tanh(sharp * wave) / np.tanh(sharp)
    noise = fields[t["field"][label], (yy.astype(np.int64) + t["oy"][label]) % size,
                   (xx.astype(np.int64) + t["ox"][label]) % size]
    shade = (dy * t["shade"][label, 0] + dx * t["shade"][label, 1]) / np.maximum(r[label], 1.0)
    tex = (t["grating"][label] * wave + t["noise"][label] * noise).astype(np.float32)
    w = t["luma"][label][..., None]
    diff = (second - base)[label]
    img = base[label] + tex[..., None] * ((1 - w) * diff + w * 0.5) + (0.5 * shade)[..., None]
    return np.clip(img, 0.0, 1.0).astype(np.float32)


def _blur(img: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur over the first two axes (reflecting borders)."""
    sig = (sigma, sigma) + (0,) * (img.ndim - 2)
    return ndimage.gaussian_filter(img, sig, mode="reflect", truncate=3.0)


def _depth_of_field(rng: np.random.Generator, img: np.ndarray, label: np.ndarray, p: LeavesParams) -> np.ndarray:
    """Three depth layers by leaf order (cut at random shares of the visible area); one in focus,
    the others blurred by ``per_layer`` times their distance to it, composited back to front."""
    if rng.random() >= p.dof:
        return img
    area = np.bincount(label.ravel(), minlength=int(label.max()) + 1)
    cum = np.cumsum(area) / area.sum()
    cuts = np.sort(rng.uniform(0.15, 0.85, 2))
    layer = np.searchsorted(cuts, cum)[label]  # 0 front, 2 back (the background leaf included)
    focus, per_layer = int(rng.integers(3)), rng.uniform(0.5, p.dof_sigma)
    sigmas = [per_layer * abs(k - focus) for k in range(3)]
    out = _blur(img, sigmas[2]) if sigmas[2] > 0 else img.copy()
    for k in (2, 1, 0):
        m = layer == k
        if sigmas[k] == 0:
            out[m] = img[m]
            continue
        mask = m.astype(np.float32)
        alpha = _blur(mask, sigmas[k])
        colour = _blur(img * mask[..., None], sigmas[k]) / np.maximum(alpha, 1e-3)[..., None]
        out += alpha[..., None] * (colour - out)
    return out


def _acquire(rng: np.random.Generator, img: np.ndarray, p: LeavesParams) -> np.ndarray:
    """Optical blur, sensor-like noise, gamma and contrast, each drawn per image."""
    if rng.random() < p.optics:
        img = _blur(img, rng.uniform(*p.optics_sigma))
    if rng.random() < p.noise:
        read, shot = rng.uniform(0.0, p.noise_std), rng.uniform(0.0, p.noise_std**2)
        img = img + np.sqrt(shot * np.clip(img, 0, 1) + read**2) * rng.standard_normal(img.shape).astype(np.float32)
    if p.tone:
        img = np.clip(img, 0.0, 1.0) ** np.exp(rng.normal(0.0, 0.2))
        mean = img.mean()
        img = mean + np.exp(rng.normal(0.0, 0.2)) * (img - mean) + rng.normal(0.0, 0.05)
    return np.clip(img, 0.0, 1.0).astype(np.float32)


def textured_leaves(size: int, rng: np.random.Generator, params: LeavesParams = DEFAULT_PARAMS,
                    return_labels: bool = False):
    """A textured dead-leaves image (size x size, RGB float32 in [0, 1]); see the module docstring.

    ``return_labels``: also return the (size, size) map of the leaf shown at each pixel (before the
    blurs), for tests and analysis.
    """
    g = _leaf_geometry(rng, size, params)
    label = _label_map(g, size)
    img = _render(rng, g, label, size, params)
    img = _depth_of_field(rng, img, label, params)
    img = _acquire(rng, img, params)
    return (img, label) if return_labels else img


def synthetic_image(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One procedural RGB image of ``kind`` (one of :data:`SYNTHETIC`)."""
    if kind == "textured":
        return textured_leaves(size, rng)
    if kind == "dead_leaves":
        return dead_leaves(size, rng)
    raise ValueError(f"unknown synthetic image kind {kind!r}; expected one of {', '.join(SYNTHETIC)}")
