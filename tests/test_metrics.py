"""PSNR and SSIM against scikit-image on real images (gray and RGB, non-square)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
from skimage import data
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from nfc_dps.metrics import coverage, expected_coverage, mse, psnr, restoration_metrics, sliced_wasserstein, ssim


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


def test_coverage_counts_pixels_within_the_sample_std():
    # samples -1, +1 at every pixel: mean 0, unbiased std sqrt(2)
    samples = torch.stack([-torch.ones(2, 1, 2, 2), torch.ones(2, 1, 2, 2)]).double()
    truth = torch.zeros(2, 1, 2, 2, dtype=torch.float64)
    truth[0, 0, 0, 0] = 1.5  # within 2 std (2.83) but not 1 std (1.41)
    truth[1] = 5.0  # outside both
    got = coverage(samples, truth)
    assert got.shape == (2, 2) and got.dtype == torch.float64
    assert torch.equal(got, torch.tensor([[0.75, 1.0], [0.0, 0.0]], dtype=torch.float64))
    assert torch.equal(coverage(samples, truth, widths=(3.5, 3.6))[1], torch.tensor([0.0, 1.0], dtype=torch.float64))  # 5 / sqrt(2) = 3.54


def test_coverage_of_gaussian_draws_matches_the_student_t_reference():
    g = torch.Generator().manual_seed(0)
    for k in (4, 16):
        samples = torch.randn(k, 64, 1, 32, 32, generator=g, dtype=torch.float64)
        truth = torch.randn(64, 1, 32, 32, generator=g, dtype=torch.float64)
        got = coverage(samples, truth).mean(0)
        for i, c in enumerate((1.0, 2.0)):  # 65536 independent pixels: standard error < 0.002
            assert abs(float(got[i]) - expected_coverage(k, c)) < 0.008, (k, c)
    assert expected_coverage(10**6, 1.0) == pytest.approx(0.6827, abs=1e-4)
    assert expected_coverage(10**6, 2.0) == pytest.approx(0.9545, abs=1e-4)


def test_coverage_errors():
    with pytest.raises(ValueError, match="K >= 2"):
        coverage(torch.zeros(1, 1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    with pytest.raises(ValueError, match="truth must have shape"):
        coverage(torch.zeros(3, 1, 1, 2, 2), torch.zeros(2, 1, 2, 2))
    with pytest.raises(ValueError, match="k >= 2"):
        expected_coverage(1, 1.0)


def test_sliced_wasserstein():
    g = torch.Generator().manual_seed(1)
    dirs = torch.randn(64, 6, generator=g, dtype=torch.float64)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    a = torch.randn(8, 1, 2, 3, generator=g, dtype=torch.float64)
    assert sliced_wasserstein(a, a.repeat(3, 1, 1, 1), dirs) == pytest.approx(0.0, abs=1e-12)
    shift = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0, 1.0], dtype=torch.float64)
    moved = a + shift.view(1, 1, 2, 3)
    # a translation moves every projection by theta . shift
    assert sliced_wasserstein(a, moved, dirs) == pytest.approx(float((dirs @ shift).pow(2).mean().sqrt()), rel=1e-12)
    # in 1-D: W2 between {0, 1} and {0, 0, 1, 1} is 0, against {0, 0, 0, 1}: sqrt(1/4)
    one = torch.ones(1, 1, dtype=torch.float64)
    pts = lambda *v: torch.tensor(v, dtype=torch.float64).view(-1, 1)  # noqa: E731
    assert sliced_wasserstein(pts(0, 1), pts(1, 0, 1, 0), one) == pytest.approx(0.0)
    assert sliced_wasserstein(pts(0, 1), pts(0, 0, 0, 1), one) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="multiple"):
        sliced_wasserstein(a, a[:5], dirs)


def test_restoration_metrics_clip_the_estimate_not_the_reference():
    """The protocol's numbers: the estimate clipped to [0, 1], the reference as given; SSIM only
    where the 7 x 7 window fits."""
    g = torch.Generator().manual_seed(0)
    ref = torch.rand(1, 3, 12, 9, generator=g, dtype=torch.float64) * 1.2 - 0.1
    x = ref + 0.3 * torch.randn(ref.shape, generator=g, dtype=torch.float64)
    m = restoration_metrics(x, ref)
    xc = x.clamp(0, 1)
    assert m["psnr"] == float(psnr(xc, ref)[0]) and m["mse"] == float(mse(xc, ref)[0])
    assert m["ssim"] == float(ssim(xc, ref)[0])
    assert m["psnr"] != float(psnr(xc, ref.clamp(0, 1))[0])
    assert restoration_metrics(x[..., :6, :], ref[..., :6, :])["ssim"] is None

