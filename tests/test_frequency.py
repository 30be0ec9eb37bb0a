import math

import pytest
import torch

from nfc_dps.frequency import (
    fit_power_law,
    fourier_filter,
    haar_decompose,
    haar_fuse,
    haar_reconstruct,
    lowpass_mask,
    power_law_spectrum,
    radial_frequency,
)

SHAPES = [(16, 16), (24, 40), (33, 17), (7, 5)]


@pytest.mark.parametrize("h,w", SHAPES)
def test_radial_frequency_range_and_symmetry(h, w):
    r = radial_frequency(h, w, dtype=torch.float64)
    assert r[0, 0] == 0
    assert math.isclose(float(r.max()), 1.0, rel_tol=1e-12)
    # radial grid is symmetric under omega -> -omega (so masks keep real images real)
    flipped = torch.roll(torch.flip(r, dims=(0, 1)), shifts=(1, 1), dims=(0, 1))
    assert torch.allclose(r, flipped)
    rr = radial_frequency(h, w, rfft=True, dtype=torch.float64)
    assert torch.allclose(rr, r[:, : w // 2 + 1])


@pytest.mark.parametrize("h,w", SHAPES)
def test_lowpass_all_pass_at_one_and_monotone(h, w):
    assert torch.equal(lowpass_mask(h, w, 1.0), torch.ones(h, w))
    assert torch.equal(lowpass_mask(h, w, 1.5, rfft=True), torch.ones(h, w // 2 + 1))
    x = torch.randn(2, 3, h, w, dtype=torch.float64)
    assert torch.equal(fourier_filter(x, lowpass_mask(h, w, 1.0, dtype=torch.float64)),
                       fourier_filter(x, torch.ones(h, w, dtype=torch.float64)))
    assert torch.allclose(fourier_filter(x, lowpass_mask(h, w, 1.0, rfft=True, dtype=torch.float64)), x, atol=1e-12)
    prev = torch.zeros(h, w)
    for c in torch.linspace(0, 1, 21):
        m = lowpass_mask(h, w, float(c))
        assert (m >= prev - 1e-7).all()
        assert m.min() >= 0 and m.max() <= 1
        assert m[0, 0] == 1.0  # DC always passes
        prev = m


def test_lowpass_rejects_bad_cutoff():
    with pytest.raises(ValueError, match="cutoff"):
        lowpass_mask(8, 8, float("nan"))
    with pytest.raises(ValueError, match="cutoff"):
        lowpass_mask(8, 8, -0.1)


@pytest.mark.parametrize("h,w", [(16, 16), (20, 12), (15, 9)])
def test_fourier_filter_real_grid_matches_full_grid_and_is_projection_like(h, w):
    x = torch.randn(2, 1, h, w, dtype=torch.float64)
    m_full = lowpass_mask(h, w, 0.3, transition=0.0, dtype=torch.float64)
    m_half = lowpass_mask(h, w, 0.3, transition=0.0, rfft=True, dtype=torch.float64)
    a, b = fourier_filter(x, m_full), fourier_filter(x, m_half)
    assert torch.allclose(a, b, atol=1e-10)
    # a hard mask is an orthogonal projection: idempotent
    assert torch.allclose(fourier_filter(a, m_full), a, atol=1e-10)
    with pytest.raises(ValueError, match="does not fit"):
        fourier_filter(x, torch.ones(h + 1, w))
    # any symmetric full-grid transfer (here an inverse power-law spectrum) equals the complex-FFT filter
    spec = 1 / power_law_spectrum(torch.tensor([0.01], dtype=torch.float64), torch.tensor([2.5], dtype=torch.float64), (h, w))
    want = torch.fft.ifft2(torch.fft.fft2(x, norm="ortho") * spec, norm="ortho").real
    assert torch.allclose(fourier_filter(x, spec), want, atol=1e-10)


@pytest.mark.parametrize("shape", [(2, 3, 16, 16), (1, 1, 24, 40), (1, 3, 33, 17), (2, 1, 7, 5)])
@pytest.mark.parametrize("levels", [1, 2, 3])
def test_haar_round_trip(shape, levels):
    x = torch.randn(shape, dtype=torch.float64)
    ll, details, sizes = haar_decompose(x, levels)
    assert (haar_reconstruct(ll, details, sizes) - x).abs().max() <= 1e-6


def test_haar_is_orthonormal_on_even_sizes():
    x = torch.randn(1, 1, 16, 8, dtype=torch.float64)
    ll, details, _ = haar_decompose(x, 2)
    energy = ll.square().sum() + sum(d.square().sum() for det in details for d in det)
    assert torch.allclose(energy, x.square().sum())
    # the LL band of a constant image carries it all
    ll, details, _ = haar_decompose(torch.ones(1, 1, 8, 8, dtype=torch.float64), 1)
    assert all(torch.allclose(d, torch.zeros_like(d)) for d in details[0])


def test_haar_fuse_weights():
    a, b = torch.randn(2, 3, 12, 10, dtype=torch.float64), torch.randn(2, 3, 12, 10, dtype=torch.float64)
    assert torch.equal(haar_fuse(a, b, 1.0, 1.0, 2), a)
    assert torch.allclose(haar_fuse(a, b, 0.0, 0.0, 2), b)
    # LL from a, details from b: the 2x2 block means equal a's
    f = haar_fuse(a, b, 1.0, 0.0, 1)
    pool = torch.nn.functional.avg_pool2d
    assert torch.allclose(pool(f, 2), pool(a, 2))
    assert torch.allclose(f - pool(f, 2).repeat_interleave(2, -2).repeat_interleave(2, -1),
                          b - pool(b, 2).repeat_interleave(2, -2).repeat_interleave(2, -1))


def test_fit_power_law_recovers_exponent():
    g = torch.Generator().manual_seed(0)
    h = w = 128
    r = radial_frequency(h, w, dtype=torch.float64).clamp_min(1 / h)
    amp = r ** (-1.0)  # power r^-2
    noise = torch.randn(4, 1, h, w, generator=g, dtype=torch.float64)
    x = torch.fft.ifft2(torch.fft.fft2(noise, norm="ortho") * amp, norm="ortho").real
    a, alpha = fit_power_law(x)
    assert torch.allclose(alpha, torch.full_like(alpha, 2.0), atol=0.15)


def test_a_one_pixel_image_is_a_clear_error_not_nan():
    import nfc_dps

    with pytest.raises(ValueError, match="1x1 image has no frequency besides its mean"):
        fit_power_law(torch.rand(1, 3, 1, 1))
    op = nfc_dps.build_operator("denoise", image_size=(1, 1))
    with pytest.raises(ValueError, match="too small to fit a power spectrum"):
        nfc_dps.restore(torch.rand(1, 3, 1, 1), op, prior=nfc_dps.priors.GaussianSpectralPrior((1, 1), channels=3),
                        progress=False, preset="fast", spectrum="measurement")
