"""sigma_y="auto": the patch-PCA noise level of a measurement (exact on white noise over a smooth image,
observed pixels only for inpainting), clear refusals, and restore() using one estimate per image."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nfc_dps
from nfc_dps.noise_level import FLOOR, estimate_sigma, measurement_sigma
from nfc_dps.operators import Inpainting


def smooth_image(size: int = 64, seed: int = 0) -> torch.Tensor:
    """A smooth colour image in [0.2, 0.8] (low-frequency cosines): (3, size, size)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, size)
    yy, xx = torch.meshgrid(t, t, indexing="ij")
    chans = [0.5 + 0.15 * torch.cos(2 * np.pi * (float(torch.rand(1, generator=g)) * xx + yy) + c) for c in range(3)]
    return torch.stack(chans)


@pytest.mark.parametrize("sigma", [0.005, 0.02, 0.1])
def test_white_noise_over_a_smooth_image_is_read_within_5_percent(sigma):
    x = smooth_image()
    y = x + sigma * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    assert estimate_sigma(y) == pytest.approx(sigma, rel=0.05)


def test_a_clean_image_gives_the_floor():
    assert estimate_sigma(smooth_image()) == FLOOR


def test_inpainting_reads_only_the_observed_pixels():
    """Missing pixels (zeros, no noise) would pull a whole-image estimate far off."""
    x = smooth_image(64)
    mask = torch.ones(64, 64)
    mask[16:48, 16:48] = 0
    op = Inpainting(mask)
    y = op.measure(x[None], 0.03, torch.Generator().manual_seed(2))
    assert measurement_sigma(y, op)[0] == pytest.approx(0.03, rel=0.05)
    assert abs(estimate_sigma(y[0]) - 0.03) > 0.1 * 0.03  # the hole's edges read as texture
    rng = np.random.default_rng(0)  # half the pixels at random: 2x2 patches (few samples: read a little low)
    scattered = Inpainting(torch.from_numpy((rng.random((128, 128)) < 0.5).astype(np.float32)))
    y = scattered.measure(smooth_image(128)[None], 0.03, torch.Generator().manual_seed(3))
    assert measurement_sigma(y, scattered)[0] == pytest.approx(0.03, rel=0.1)


def test_what_cannot_be_read_is_refused_in_words():
    with pytest.raises(ValueError, match="not an image"):
        measurement_sigma(torch.rand(1, 3, 24, 24), nfc_dps.build_operator("phase_retrieval", 16))
    with pytest.raises(ValueError, match="too small"):
        estimate_sigma(torch.rand(3, 4, 4))
    empty = Inpainting(torch.zeros(32, 32))
    with pytest.raises(ValueError, match="too few observed pixels"):
        measurement_sigma(torch.rand(1, 3, 32, 32), empty)
    with pytest.raises(ValueError, match="shape"):
        estimate_sigma(torch.rand(1, 3, 16, 16))


def test_restore_auto_uses_one_estimate_per_image(tiny_prior):
    op = nfc_dps.build_operator("denoise", 16)
    x = torch.stack([smooth_image(16, 0), smooth_image(16, 1)])
    y = torch.cat([op.measure(x[:1], 0.02, torch.Generator().manual_seed(0)),
                   op.measure(x[1:], 0.08, torch.Generator().manual_seed(1))])
    est = measurement_sigma(y, op)
    out = nfc_dps.restore(y, op, prior=str(tiny_prior), sigma_y="auto", num_levels=2, progress=False, seed=5)
    assert out.noise_sigma == est and est[1] > 2 * est[0]
    for b in range(2):  # image b is restore() of image b alone at its own estimate, with its seed
        alone = nfc_dps.restore(y[b:b + 1], op, prior=str(tiny_prior), sigma_y=est[b], num_levels=2, progress=False,
                                seed=5 + b)
        assert torch.equal(out.image[b:b + 1], alone.image) and alone.noise_sigma == est[b]
    one = nfc_dps.restore(y[0].numpy().transpose(1, 2, 0), op, prior=str(tiny_prior), sigma_y="auto", num_levels=2,
                          progress=False)
    assert isinstance(one.image, np.ndarray) and one.noise_sigma == pytest.approx(est[0])


def test_restore_auto_bad_input(tiny_prior):
    op = nfc_dps.build_operator("denoise", 16)
    y = torch.rand(1, 3, 16, 16)
    with pytest.raises(ValueError, match="'auto'"):
        nfc_dps.restore(y, op, prior=str(tiny_prior), sigma_y="automatic")
    with pytest.raises(TypeError, match="one of sigma_y and noise"):
        nfc_dps.restore(y, op, prior=str(tiny_prior), sigma_y="auto", noise="poisson:30")
