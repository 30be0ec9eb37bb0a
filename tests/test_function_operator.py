"""FunctionOperator's checks of a user's map (issue 43): numpy outputs, numpy and float shapes,
affine and nonlinear maps refused at construction, and the batch axis kept on every call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nfc_dps.operators import FunctionOperator


def subsample(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, 8, 8) -> (B, 3, 4, 4): every other pixel, a linear map."""
    return x[:, :, ::2, ::2]


def test_a_linear_map_is_accepted_and_its_autograd_adjoint_is_the_transpose():
    op = FunctionOperator(subsample, (3, 8, 8), (3, 4, 4))
    y = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    expected = torch.zeros(2, 3, 8, 8)
    expected[:, :, ::2, ::2] = y
    torch.testing.assert_close(op.A_adjoint(y), expected)


def test_a_map_returning_numpy_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"A's output .* must be a torch\.Tensor, got numpy\.ndarray.*torch\.from_numpy"):
        FunctionOperator(lambda x: x.numpy()[:, :, ::2, ::2], (3, 8, 8), (3, 4, 4))
    # a map that goes through numpy on its way: its autograd adjoint cannot run, said at construction
    with pytest.raises(TypeError, match="A_adjoint=None .* does not run under autograd.*no numpy.*or pass A_adjoint"):
        FunctionOperator(lambda x: torch.from_numpy(np.asarray(x.detach())[:, :, ::2, ::2].copy()), (3, 8, 8),
                         (3, 4, 4))


def test_numpy_integer_shapes_are_taken_and_a_fractional_size_is_refused():
    op = FunctionOperator(subsample, (np.int64(3), np.int32(8), 8), [np.int64(3), 4, 4.0])
    assert op.image_dims == (3, 8, 8) and op.measurement_dims == (3, 4, 4)
    assert all(type(v) is int for v in (*op.image_dims, *op.measurement_dims))
    with pytest.raises(ValueError, match=r"image_shape .* \(3, 8\.7, 8\): 8\.7 is not a whole number"):
        FunctionOperator(subsample, (3, 8.7, 8), (3, 4, 4))
    with pytest.raises(ValueError, match="measurement_shape must be a sequence of positive ints"):
        FunctionOperator(subsample, (3, 8, 8), (3, "4", 4))
    with pytest.raises(ValueError, match="image_shape must be a sequence of positive ints"):
        FunctionOperator(subsample, (True, 8, 8), (3, 4, 4))


def test_an_affine_map_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"A is not linear: A\(0\) is not 0 \(largest \|A\(0\)\| = 0\.1.*offset"):
        FunctionOperator(lambda x: subsample(x) + 0.1, (3, 8, 8), (3, 4, 4))


@pytest.mark.parametrize("fn", [lambda x: subsample(x) ** 2, lambda x: subsample(x).clamp(0, 1),
                                lambda x: subsample(x) / (1 + subsample(x).abs().mean())])
def test_a_nonlinear_map_is_refused_at_construction(fn):
    with pytest.raises(ValueError, match=r"A is not linear: A\(a x \+ b y\) differs from a A\(x\) \+ b A\(y\)"):
        FunctionOperator(fn, (3, 8, 8), (3, 4, 4))


def test_a_map_that_drops_images_of_the_batch_is_refused():
    with pytest.raises(ValueError, match="has 1 item.* on the batch axis, the input 2"):
        FunctionOperator(lambda x: subsample(x)[:1], (3, 8, 8), (3, 4, 4))
    # a map that keeps the batch of the construction check but not of a later call
    op = FunctionOperator(lambda x: subsample(x)[:2], (3, 8, 8), (3, 4, 4))
    with pytest.raises(ValueError, match="has 2 item.* on the batch axis, the input 3"):
        op.A(torch.zeros(3, 3, 8, 8))

    def adjoint(y):  # the transpose, for at most two measurements
        out = torch.zeros(y.shape[0], 3, 8, 8, dtype=y.dtype)
        out[:, :, ::2, ::2] = y
        return out[:2]

    op = FunctionOperator(subsample, (3, 8, 8), (3, 4, 4), adjoint)
    with pytest.raises(ValueError, match="A_adjoint's output .* has 2 item.* the input 3"):
        op.A_adjoint(torch.zeros(3, 3, 4, 4))
