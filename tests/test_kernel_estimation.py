"""The kernel step of blind deblurring on exact cases: a known kernel recovered from a photo given
its sharp image, the delta when nothing is blurred, the shift-invariant kernel error."""

import numpy as np
import pytest
import torch

from nfc_dps.operators.blur import BlurOperator
from nfc_dps.operators.kernel_estimation import centred_kernel, kernel_error, kernel_step, shock_filtered
from nfc_dps.operators.kernels import gaussian_kernel, motion_kernel
from nfc_dps.priors.training_data import load_skimage_image


@pytest.fixture(scope="module")
def photo() -> torch.Tensor:
    img = load_skimage_image("camera")[96:224, 160:288]
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float()


@pytest.mark.parametrize("seed", [1, 2])
def test_known_motion_kernel_recovered_from_its_image(photo, seed):
    k = motion_kernel(15, 0.5, seed)
    y = BlurOperator(k, "valid").A(photo)
    estimate = kernel_step(photo[0], y[0], 15, iterations=200, gamma=1e-6, threshold=0.0)
    assert estimate.shape == (15, 15)
    assert float(estimate.sum()) == pytest.approx(1.0)
    assert kernel_error(estimate, k) < 0.05


def test_noisy_photo_recovers_the_kernel_to_a_stated_error(photo):
    k = motion_kernel(15, 0.5, 3)
    y = BlurOperator(k, "valid").measure(photo, sigma_y=0.01, generator=torch.Generator().manual_seed(0))
    assert kernel_error(kernel_step(photo[0], y[0], 15), k) < 0.35
    # a Gaussian guess of the same size is much further off
    assert kernel_error(gaussian_kernel(15, 2.0), k) > 0.6


def test_unblurred_photo_gives_the_delta(photo):
    y = photo[0, :, 7:-7, 7:-7]  # the valid part of the identity blur of a 15-px kernel
    estimate = kernel_step(photo[0], y, 15)
    delta = torch.zeros(15, 15, dtype=torch.float64)
    delta[7, 7] = 1
    assert kernel_error(estimate, delta) < 1e-3


def test_salient_edges_only_still_recover_the_kernel(photo):
    k = motion_kernel(15, 0.5, 1)
    y = BlurOperator(k, "valid").A(photo)
    assert kernel_error(kernel_step(photo[0], y[0], 15, salient=0.2, iterations=100), k) < 0.2
    with pytest.raises(ValueError, match="salient"):
        kernel_step(photo[0], y[0], 15, salient=0.0)


def test_wrong_photo_size_is_refused(photo):
    with pytest.raises(ValueError, match=r"kernel of 15 px give a photo of \(114, 114\)"):
        kernel_step(photo[0], photo[0], 15)


def test_kernel_error_is_shift_invariant_and_sized_freely():
    k = motion_kernel(11, 0.5, 4).double()
    shifted = torch.roll(torch.nn.functional.pad(k, (2, 2, 2, 2)), (1, -2), (0, 1))
    assert kernel_error(shifted, k) == pytest.approx(0.0, abs=1e-7)
    assert kernel_error(k, k) == pytest.approx(0.0, abs=1e-7)
    other = motion_kernel(11, 0.5, 5).double()
    assert kernel_error(other, k) > 0.3


def test_centred_kernel_moves_the_centre_of_mass_to_the_middle():
    k = torch.zeros(9, 9, dtype=torch.float64)
    k[1, 6] = k[2, 7] = 0.5
    c = centred_kernel(k)
    grid = torch.arange(9, dtype=torch.float64)
    assert float((c.sum(1) * grid).sum()) == pytest.approx(4.0, abs=0.51)
    assert float((c.sum(0) * grid).sum()) == pytest.approx(4.0, abs=0.51)
    assert float(c.sum()) == pytest.approx(1.0)
    empty = centred_kernel(torch.zeros(5, 5, dtype=torch.float64))
    assert float(empty[2, 2]) == 1.0


def test_salient_out_of_range_is_refused_whatever_its_value(photo):
    y = photo[0, :, 7:-7, 7:-7]
    for bad in (1.5, float("nan"), -0.1):
        with pytest.raises(ValueError, match="salient"):
            kernel_step(photo[0], y, 15, salient=bad)


def test_shock_filter_steepens_an_edge_and_keeps_flat_parts():
    """A ramp comes out steeper, its flat sides far from it unchanged; zero steps is the image itself."""
    ramp = torch.clamp((torch.arange(40, dtype=torch.float64) - 20) / 8 + 0.5, 0, 1)
    x = ramp.repeat(16, 1)  # (16, 40): flat 0, a ramp of 8 px, flat 1
    out = shock_filtered(x, 5)
    assert torch.equal(shock_filtered(x, 0), x)
    assert float((out[:, 1:] - out[:, :-1]).abs().max()) > 2 * float((x[:, 1:] - x[:, :-1]).abs().max())
    assert torch.equal(out[:, :8], x[:, :8]) and torch.equal(out[:, -8:], x[:, -8:])
