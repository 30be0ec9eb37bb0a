"""PSNR and SSIM against scikit-image on real images (gray and RGB, non-square)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
from skimage import data
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from nfc_dps.metrics import mse, psnr, ssim


def _crop(name):
    img = getattr(data, name)().astype(np.float64) / 255.0
    crops = {"astronaut": (slice(30, 126), slice(180, 244)),  # 96 x 64 RGB
             "camera": (slice(100, 150), slice(200, 290)),  # 50 x 90 gray
             "coffee": (slice(100, 180), slice(250, 370))}  # 80 x 120 RGB
    return img[crops[name]]


def _degrade(img, seed):
    """Three degraded versions: noise, blur, blur + noise (clipped to [0, 1] as callers do)."""
    rng = np.random.default_rng(seed)
    sig = (1.5, 1.5, 0) if img.ndim == 3 else 1.5
    blurred = ndi.gaussian_filter(img, sig)
    return [np.clip(img + 0.05 * rng.standard_normal(img.shape), 0, 1), blurred,
            np.clip(blurred + 0.02 * rng.standard_normal(img.shape), 0, 1)]


def _to_tensor(arr):
    t = torch.from_numpy(np.ascontiguousarray(arr))
    return t.permute(2, 0, 1)[None] if t.ndim == 3 else t[None, None]


@pytest.mark.parametrize("name", ["astronaut", "camera", "coffee"])
def test_against_skimage(name):
    ref = _crop(name)
    outs = _degrade(ref, 0)
    x = torch.cat([_to_tensor(o) for o in outs]).float()
    y = _to_tensor(ref).expand_as(x).float()
    got_psnr, got_ssim = psnr(x, y), ssim(x, y)
    assert got_psnr.shape == (3,) and got_ssim.shape == (3,)
    channel_axis = -1 if ref.ndim == 3 else None
    for i, o in enumerate(outs):
        # compare on the same float32-rounded values the tensors hold
        o32, r32 = o.astype(np.float32).astype(np.float64), ref.astype(np.float32).astype(np.float64)
        want_ssim = structural_similarity(o32, r32, data_range=1, channel_axis=channel_axis)
        want_psnr = peak_signal_noise_ratio(r32, o32, data_range=1)
        assert abs(float(got_ssim[i]) - want_ssim) < 1e-4, (i, float(got_ssim[i]), want_ssim)
        assert abs(float(got_psnr[i]) - want_psnr) < 1e-4, (i, float(got_psnr[i]), want_psnr)
    # sanity: the degradations are distinguishable
    assert float(got_ssim.min()) < 0.95


def test_data_range_and_symmetry():
    ref = _crop("coffee")
    noisy = _degrade(ref, 1)[0]
    x, y = _to_tensor(noisy), _to_tensor(ref)
    want = structural_similarity(noisy * 255, ref * 255, data_range=255, channel_axis=-1)
    assert abs(float(ssim(x * 255, y * 255, data_range=255)[0]) - want) < 1e-4
    assert abs(float(psnr(x * 255, y * 255, data_range=255)[0]) - float(psnr(x, y)[0])) < 1e-9
    assert torch.allclose(ssim(x, y), ssim(y, x)) and torch.allclose(psnr(x, y), psnr(y, x))


def test_identical_and_batch_independence():
    y = _to_tensor(_crop("astronaut"))
    assert float(ssim(y, y)[0]) == pytest.approx(1.0, abs=1e-12)
    assert torch.isinf(psnr(y, y)).all()
    x = torch.cat([y, y.flip(-1), 1 - y])
    yy = y.expand_as(x)
    batch = ssim(x, yy)
    for i in range(3):
        assert float(batch[i]) == pytest.approx(float(ssim(x[i: i + 1], y)[0]), abs=1e-12)
    assert float(mse(x[:1], y)[0]) == 0


def test_no_clipping():
    """Metrics take images as given: out-of-range values are not clipped."""
    y = torch.full((1, 1, 16, 16), 0.5)
    x = y + 0.7  # 1.2, above the range
    assert float(psnr(x, y)[0]) == pytest.approx(10 * np.log10(1 / 0.49), abs=1e-4)
    assert float(psnr(x.clamp(0, 1), y)[0]) != pytest.approx(float(psnr(x, y)[0]))


def test_errors():
    a = torch.rand(1, 3, 16, 16)
    with pytest.raises(ValueError, match=r"same shape.*\(1, 3, 16, 16\).*\(1, 3, 16, 15\)"):
        psnr(a, torch.rand(1, 3, 16, 15))
    with pytest.raises(ValueError, match=r"same shape"):
        ssim(a, torch.rand(1, 1, 16, 16))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\).*\(3, 16, 16\)"):
        ssim(a[0], a[0])
    with pytest.raises(ValueError, match=r"at least 7x7.*\(6, 16\)"):
        ssim(a[..., :6, :], a[..., :6, :])
    with pytest.raises(ValueError, match=r"data_range.*0"):
        psnr(a, a, data_range=0)
    with pytest.raises(TypeError, match="ndarray"):
        psnr(a.numpy(), a)
