"""Colorization: the luma operator, its decomposition, the registry entry, every method that takes
it through the API (exact Gaussian oracle prior, 16 px), and the command line end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nfc_dps import build_operator, restore
from nfc_dps.operators import ChannelDecomposition, check_task_params
from nfc_dps.operators.colorize import LUMA_WEIGHTS, Colorization
from nfc_dps.priors.gaussian import GaussianSpectralPrior

SIZE = 16


def _rgb(seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.rand(batch, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_colorize_measures_the_luma_channel():
    op = build_operator("colorize", SIZE)
    assert isinstance(op, Colorization) and op.image_channels == 3
    x = _rgb()
    y = op.A(x)
    assert y.shape == (1, 1, SIZE, SIZE)
    w = torch.tensor(LUMA_WEIGHTS, dtype=torch.float64)
    torch.testing.assert_close(y[0, 0], torch.einsum("c,chw->hw", w, x[0]), rtol=0, atol=1e-15)
    torch.testing.assert_close(op.A(torch.ones_like(x)), torch.ones_like(y), rtol=0, atol=1e-12)  # a gray level stays
    assert op.image_shape(y.shape) == (1, 3, SIZE, SIZE)
    check_task_params("colorize")
    from nfc_dps.bench.spec import DEFAULT_TASKS, task_specs

    assert "colorize" in task_specs("local", 64, "circular") and "colorize" not in DEFAULT_TASKS  # opt-in
    with pytest.raises(ValueError, match="RGB images"):
        op.A(torch.rand(1, 1, SIZE, SIZE))
    with pytest.raises(ValueError, match="gray"):
        op.A_adjoint(torch.rand(1, 3, SIZE, SIZE))
    with pytest.raises(ValueError, match="three finite numbers"):
        Colorization((0.5, 0.5))


def test_colorize_decomposition_gives_the_closed_forms():
    """One singular value ||w|| per pixel, two unobserved colour directions: A^+ y = w y / ||w||^2,
    and the prox is the derived closed form."""
    op = Colorization()
    w = torch.tensor(LUMA_WEIGHTS, dtype=torch.float64)
    dec = op.decomposition()
    assert isinstance(dec, ChannelDecomposition)
    s = dec.singular_values(SIZE, SIZE, torch.float64).flatten()
    torch.testing.assert_close(s, torch.stack([w.norm(), torch.tensor(0.0, dtype=torch.float64),
                                               torch.tensor(0.0, dtype=torch.float64)]), rtol=0, atol=1e-15)
    y = op.A(_rgb(1))
    torch.testing.assert_close(op.A_pinv(y), y * (w / w.square().sum()).view(1, 3, 1, 1), rtol=0, atol=1e-14)
    z = _rgb(2)
    x = op.prox(y, z, 0.1, 0.5)
    grad = op.A_adjoint(op.A(x) - y) / 0.1**2 + (x - z) / 0.5**2
    assert float(grad.abs().max()) < 1e-10
    assert op.gram_eigenvalues(4, 6).shape == (3 * 4 * 6,)


@pytest.mark.parametrize("method", ["nfc", "dpir", "ddrm", "ddnm"])
def test_every_method_colorizes_a_gray_photo(method):
    """A gray numpy measurement restores to an RGB image that agrees with it; the deterministic
    methods (near the posterior mean of the oracle prior) beat the gray guess y in every channel,
    which a posterior sample (twice the mean's error) need not."""
    prior = GaussianSpectralPrior((SIZE, SIZE), channels=3)
    truth = ((prior.sample(1, torch.Generator().manual_seed(0), dtype=torch.float64) + 1) / 2).float()
    op = Colorization()
    gray = op.measure(truth, 0.01, torch.Generator().manual_seed(1))
    steps = {"nfc": "num_levels"}.get(method, "num_steps")
    out = restore(gray[0, 0].numpy(), op, prior, method=method, sigma_y=0.01, progress=False, **{steps: 8}).image
    assert out.shape == (SIZE, SIZE, 3)
    x = torch.from_numpy(out).permute(2, 0, 1)[None]
    assert float((op.A(x) - gray).abs().mean()) < 0.1
    if method in ("nfc", "dpir"):
        gray_guess = gray.expand_as(truth)
        assert float((x - truth).square().mean()) < float((gray_guess - truth).square().mean())


def test_a_gray_prior_cannot_colorize():
    with pytest.raises(ValueError, match="restores 3-channel images from this measurement, but the prior models 1"):
        restore(torch.rand(1, 1, SIZE, SIZE), Colorization(), GaussianSpectralPrior((SIZE, SIZE), channels=1),
                method="ddnm", progress=False, num_steps=2)


def test_ddnm_without_noise_matches_the_measurement_exactly():
    prior = GaussianSpectralPrior((SIZE, SIZE), channels=3)
    truth = ((prior.sample(1, torch.Generator().manual_seed(3), dtype=torch.float64) + 1) / 2).float()
    op = Colorization()
    gray = op.A(truth)
    out = restore(gray, op, prior, method="ddnm", sigma_y=0.0, progress=False, num_steps=8).image
    assert out.shape == (1, 3, SIZE, SIZE)
    inside = ((out > 0) & (out < 1)).all(1, keepdim=True)  # the clipping to [0, 1] aside
    assert float((op.A(out) - gray)[inside].abs().max()) < 1e-4


@pytest.mark.slow
def test_simulate_and_restore_colorize_from_the_command_line(tmp_path):
    """nfc-dps simulate --task colorize writes a gray measurement of an RGB photo; restore --task
    colorize turns a gray photo (here that measurement) into an RGB restoration."""
    from nfc_dps.cli import main
    from nfc_dps.io import read_image, write_image

    rgb = np.random.default_rng(0).random((32, 32, 3)).astype(np.float32)
    write_image(tmp_path / "photo.png", rgb)
    assert main(["simulate", "-i", str(tmp_path / "photo.png"), "-o", str(tmp_path / "sim"), "--task", "colorize",
                 "-q"]) == 0
    gray, _ = read_image(tmp_path / "sim" / "measurements" / "photo.png")
    assert gray.shape == (32, 32)
    assert main(["restore", "-i", str(tmp_path / "sim" / "measurements" / "photo.png"), "--task", "colorize",
                 "-o", str(tmp_path / "out"), "--method", "ddrm", "--steps", "2", "-q"]) == 0
    restored, _ = read_image(tmp_path / "out" / "photo.png")
    assert restored.shape == (32, 32, 3)


def test_the_wiener_start_of_a_colorization_has_no_colour_cast():
    """A power law has no correlation between channels, so its linear-MMSE start would put y's
    residual along the luma weights (green): the start is the gray image, which fits y exactly."""
    from nfc_dps.samplers.common import initial_estimate

    op = Colorization()
    y = torch.rand(2, 1, SIZE, SIZE, generator=torch.Generator().manual_seed(0)) * 2 - 1
    spectrum = torch.ones(1, 1, SIZE, SIZE)
    start = initial_estimate(op, y, 0.05, (2, 3, SIZE, SIZE), "wiener", spectrum)
    torch.testing.assert_close(start, y.expand(-1, 3, -1, -1))
    torch.testing.assert_close(op.A(start), y)
