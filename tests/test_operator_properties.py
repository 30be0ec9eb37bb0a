"""Property tests (hypothesis) over every registered operator and wrapper: random sizes, gray and
RGB (the channels an operator takes where it declares them), non-square images, CroppedOperator
around each operator, FunctionOperator over a random matrix. Checked: the adjoint, A A^+ A = A,
prox optimality, the decomposition, and the declared structure (transfer function, pixel mask, blur
kernel, downsampling factor, image region) against the applied operator. float64, small sizes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nfc_dps.io import write_image
from nfc_dps.operators import (
    TASKS,
    BlurOperator,
    CroppedOperator,
    FunctionOperator,
    LinearOperator,
    build_operator,
    gaussian_kernel,
    random_mask,
)
from nfc_dps.operators.base import FAMILIES
from nfc_dps.operators.decomposition import FourierDecomposition, PixelDecomposition

#: small values of the task parameters, for the operators' few-pixel images (SR x 2 on even sizes)
SMALL_PARAMS = {"factor": 2, "kernel_size": 5, "box_size": 2, "margin": 1}
#: every registered task (both boundaries of the blurs), and a FunctionOperator over a random matrix
KINDS = tuple(f"{name}:{b}" if "boundary" in task.params else name
              for name, task in TASKS.items() if task.family != "nonlinear"
              for b in (("circular", "reflect") if "boundary" in task.params else ("",))
              ) + ("function",)
#: the nonlinear tasks (their Jacobian is checked below) and a nonlinear FunctionOperator
NONLINEAR_KINDS = tuple(name for name, task in TASKS.items() if task.family == "nonlinear") + ("function_nonlinear",)
PROPERTY_SETTINGS = settings(max_examples=25, deadline=None, database=None, derandomize=True)
_FILES = Path(tempfile.mkdtemp(prefix="nfc_dps_operator_files_"))


def _operator_file(what: str, h: int, w: int, seed: int) -> str:
    """A kernel (5 x 5) or an (h, w) mask file for the tasks that read their operator from one."""
    if what == "kernel":
        path = _FILES / f"kernel_{seed}.npy"
        np.save(path, gaussian_kernel(5, 1.0 + 0.1 * (seed % 5)).numpy())
    else:
        path = _FILES / f"mask_{h}x{w}_{seed}.png"
        write_image(path, random_mask(h, w, 0.5, seed).numpy().astype(np.float32))
    return str(path)


def _operator(kind: str, h: int, w: int, seed: int, channels: int = 1) -> LinearOperator:
    """An operator of ``kind`` (a registered task, ``task:boundary`` for the blurs) for (h, w)
    images (h, w even); "function": a random Gaussian matrix from the (channels, h, w) image to
    about half as many values, its adjoint by autograd."""
    if kind == "function":
        n = channels * h * w
        m = n // 2 + 1
        matrix = torch.randn((m, n), generator=torch.Generator().manual_seed(seed), dtype=torch.float64) / n**0.5
        return FunctionOperator(lambda x: (x.flatten(1) @ matrix.T.to(x.dtype)).view(-1, 1, m, 1), (channels, h, w),
                                (1, m, 1), dtype=torch.float64)
    name, _, boundary = kind.partition(":")
    task = TASKS[name]
    params = {k: v for k, v in SMALL_PARAMS.items() if k in task.params}
    if boundary:
        params["boundary"] = boundary
    if task.reads:
        params[task.file_param] = _operator_file(task.reads, h, w, seed)
    op = build_operator(name, (h, w), seed=seed, **params)
    if task.estimates:  # the blur it restores with, its kernel given (a few pixels hold no estimate)
        op = type(op)(op.size, op.boundary, kernel=op.kernel)
    return op


def test_every_registered_task_is_a_kind():
    assert {k.partition(":")[0] for k in KINDS + NONLINEAR_KINDS} == set(TASKS) | {"function", "function_nonlinear"}


@st.composite
def problems(draw, wrapped: bool | None = None, kind: str | None = None):
    """(operator, image shape (B, C, H, W), seed): an operator (of ``kind``, else any), possibly on
    a larger canvas."""
    kind = draw(st.sampled_from(KINDS)) if kind is None else kind
    channels = draw(st.sampled_from((1, 3)))
    h, w = 2 * draw(st.integers(2, 6)), 2 * draw(st.integers(2, 6))  # even: SR x 2 divides them
    seed = draw(st.integers(0, 2**16))
    op = _operator(kind, h, w, seed, channels)
    channels = op.image_channels or channels
    crop = draw(st.booleans()) if wrapped is None else wrapped
    if crop:
        op = CroppedOperator(op, (h, w), (h + draw(st.integers(0, 3)), w + draw(st.integers(1, 3))))
        h, w = op.canvas_h, op.canvas_w
    return op, (draw(st.integers(1, 2)), channels, h, w), seed


def _randn(shape, seed: int) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a * b).sum())


@PROPERTY_SETTINGS
@given(problems())
def test_adjoint(problem):
    op, shape, seed = problem
    x = _randn(shape, seed)
    y = _randn(op.measurement_shape(shape), seed + 1)
    assert tuple(op.image_shape(y.shape)) == tuple(shape)
    lhs, rhs = _dot(op.A(x), y), _dot(x, op.A_adjoint(y))
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs))


@PROPERTY_SETTINGS
@given(problems())
def test_pseudo_inverse(problem):
    op, shape, seed = problem
    ax = op.A(_randn(shape, seed))
    back = op.A(op.A_pinv(ax))
    # closed forms reach round-off; the conjugate-gradient fallback (reflect blur, crops: the base
    # class's 100 iterations at tol 1e-6 on the normal equations) stops at about 1e-2 on 5 x 5 kernels
    closed = (not isinstance(op, CroppedOperator) and not (op.family == "blur" and not op.is_circulant)
              and not isinstance(op, FunctionOperator))
    tol = 1e-6 if closed else 3e-2
    assert float((back - ax).norm()) <= tol * max(1.0, float(ax.norm()))


@PROPERTY_SETTINGS
@given(problems(), st.floats(0.05, 1.0), st.floats(0.1, 3.0))
def test_prox_optimality(problem, sigma_y, r):
    """The prox's gradient A^T (A x - y) / s^2 + (x - z) / r^2 vanishes."""
    op, shape, seed = problem
    z = _randn(shape, seed)
    y = _randn(op.measurement_shape(shape), seed + 1)
    x = op.prox(y, z, sigma_y, r, max_iter=500, tol=1e-12)
    grad = op.A_adjoint(op.A(x) - y) / sigma_y**2 + (x - z) / r**2
    scale = float((op.A_adjoint(y) / sigma_y**2 + z / r**2).norm())
    assert float(grad.norm()) <= 1e-7 * max(1.0, scale)


@PROPERTY_SETTINGS
@given(problems(kind="function"), st.floats(0.05, 1.0), st.floats(0.1, 3.0))
def test_function_operator_over_a_random_matrix(problem, sigma_y, r):
    """FunctionOperator on every example (the tests above draw it among the other kinds): its
    autograd adjoint is the matrix's transpose, its CG pseudo-inverse and prox solve."""
    op, shape, seed = problem
    x = _randn(shape, seed)
    y = _randn(op.measurement_shape(shape), seed + 1)
    lhs, rhs = _dot(op.A(x), y), _dot(x, op.A_adjoint(y))
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs))
    ax = op.A(x)
    assert float((op.A(op.A_pinv(ax)) - ax).norm()) <= 1e-4 * float(ax.norm())
    z = _randn(shape, seed + 2)
    p = op.prox(y, z, sigma_y, r, max_iter=500, tol=1e-12)
    grad = op.A_adjoint(op.A(p) - y) / sigma_y**2 + (p - z) / r**2
    assert float(grad.norm()) <= 1e-7 * max(1.0, float((op.A_adjoint(y) / sigma_y**2 + z / r**2).norm()))


@PROPERTY_SETTINGS
@given(problems(wrapped=False))
def test_declared_structure_matches_the_operator(problem):
    op, shape, seed = problem
    x = _randn(shape, seed)
    h, w = shape[-2:]
    ax = op.A(x)
    assert op.family in FAMILIES
    assert op.image_region() is None
    if op.is_circulant:
        H = op.transfer_function(h, w, dtype=torch.float64)
        assert H.shape == (h, w) and H.dtype == torch.complex128
        torch.testing.assert_close(ax, torch.fft.ifft2(H * torch.fft.fft2(x)).real, rtol=0, atol=1e-12)
        assert isinstance(op.decomposition(), FourierDecomposition)
    mask = op.pixel_mask()
    if mask is not None:
        assert mask.shape == (h, w) and bool(((mask == 0) | (mask == 1)).all())
        assert torch.equal(ax, mask.double() * x)
        assert isinstance(op.decomposition(), FourierDecomposition if op.is_circulant else PixelDecomposition)
    kernel = op.blur_kernel()
    if kernel is not None:
        assert op.family == "blur" and abs(float(kernel.sum()) - 1) < 1e-6
        if op.is_circulant:  # a circular convolution with that kernel, centre (kh // 2, kw // 2) at the origin
            kh, kw = kernel.shape
            ref = torch.zeros_like(x)
            for a in range(kh):
                for b in range(kw):
                    ref += float(kernel[a, b]) * torch.roll(x, (a - kh // 2, b - kw // 2), dims=(-2, -1))
            torch.testing.assert_close(ax, ref, rtol=0, atol=1e-6)
    factor = op.downsampling_factor
    if factor is not None:
        assert op.family == "sr" and ax.shape[-2:] == (h // factor, w // factor)
        ones = torch.ones((1, 1, h, w), dtype=torch.float64)
        torch.testing.assert_close(op.A(ones), torch.ones((1, 1, h // factor, w // factor), dtype=torch.float64))
    if op.decomposition() is None:
        assert not op.is_circulant and mask is None
    record = op.describe()
    assert json.loads(json.dumps(record)) == record
    assert record["family"] == op.family and record["circulant"] == op.is_circulant


@PROPERTY_SETTINGS
@given(problems(wrapped=False))
def test_decomposition_is_the_operator(problem):
    """A = U diag(d) V^H: A x = U(d V^H x), A^T y = V(conj(d) U^H y), V^H orthonormal (V V^H = I,
    norms kept), and the eigenvalues of A^T A are |d|^2."""
    op, shape, seed = problem
    decomposition = op.decomposition()
    if decomposition is None:
        return
    x = _randn(shape, seed)
    y = _randn(op.measurement_shape(shape), seed + 1)
    h, w = shape[-2:]
    d = decomposition.diagonal(h, w, torch.float64)
    torch.testing.assert_close(decomposition.U(d * decomposition.V_adjoint(x)), op.A(x), rtol=0, atol=1e-10)
    torch.testing.assert_close(decomposition.V(d.conj() * decomposition.U_adjoint(y)), op.A_adjoint(y), rtol=0, atol=1e-10)
    c = decomposition.V_adjoint(x)
    torch.testing.assert_close(decomposition.V(c), x, rtol=0, atol=1e-10)
    assert abs(float(c.abs().square().sum()) - float(x.square().sum())) <= 1e-9 * float(x.square().sum())
    torch.testing.assert_close(op.gram_eigenvalues(h, w), d.abs().square().expand(*d.shape[:-2], h, w).flatten())


@PROPERTY_SETTINGS
@given(problems(wrapped=True))
def test_cropped_operator_forwards_the_inner_declarations(problem):
    op, shape, seed = problem
    inner = op.inner
    h, w = op.image_region()
    x = _randn(shape, seed)
    torch.testing.assert_close(op.A(x), inner.A(x[..., :h, :w]), rtol=0, atol=0)
    x_moved = x.clone()
    x_moved[..., h:, :] = 7.0  # the canvas border is not measured
    x_moved[..., :, w:] = 7.0
    assert torch.equal(op.A(x_moved), op.A(x))
    assert op.family == inner.family and op.downsampling_factor == inner.downsampling_factor
    assert (op.blur_kernel() is None) == (inner.blur_kernel() is None)
    assert not op.is_circulant and op.pixel_mask() is None and op.decomposition() is None
    record = op.describe()
    assert record["inner"] == inner.describe() and record["image_hw"] == [h, w]
    assert json.loads(json.dumps(record)) == record


@PROPERTY_SETTINGS
@given(problems())
def test_declared_gram_eigenvalues_are_those_of_the_dense_normal_matrix(problem):
    """gram_eigenvalues(h, w) against eigvalsh of the dense A^T A on one channel (an (h w)^2 matrix
    built from A), or on all C channels for an operator that mixes them (C h w values); the
    operators without a declaration are the reflect-boundary blurs (and crops of them)."""
    op, shape, seed = problem
    h, w = shape[-2:]
    lam = op.gram_eigenvalues(h, w)
    inner = getattr(op, "inner", op)
    if lam is None:
        assert (isinstance(inner, BlurOperator) and not inner.is_circulant) or isinstance(inner, FunctionOperator)
        return
    n = lam.numel()
    assert lam.dtype == torch.float64 and n in (h * w, shape[1] * h * w)
    basis = torch.eye(n, dtype=torch.float64).reshape(n, n // (h * w), h, w)
    a = op.A(basis).reshape(n, -1)  # row i: A e_i
    dense = a @ a.T  # A^T A in the pixel basis
    want = torch.linalg.eigvalsh(dense)
    torch.testing.assert_close(lam.sort().values, want, rtol=0, atol=1e-9)


@PROPERTY_SETTINGS
@given(problems())
def test_approximate_gram_eigenvalues_are_exact_where_declared(problem):
    """approximate_gram_eigenvalues: the declared eigenvalues where there are some; for a
    reflect-boundary blur those of the circular blur with its kernel (a crop of one adds a zero
    per pixel outside the image)."""
    op, shape, seed = problem
    h, w = shape[-2:]
    lam, approx = op.gram_eigenvalues(h, w), op.approximate_gram_eigenvalues(h, w)
    if lam is not None:
        assert torch.equal(approx, lam)
        return
    inner = getattr(op, "inner", op)
    if isinstance(inner, FunctionOperator):  # declares nothing, vouches for nothing
        assert approx is None
        return
    ih, iw = op.image_region() or (h, w)
    want = BlurOperator(inner.blur_kernel(), "circular").gram_eigenvalues(ih, iw)
    want = torch.cat([want, want.new_zeros(h * w - ih * iw)])
    assert approx.dtype == torch.float64 and approx.shape == (h * w,)
    torch.testing.assert_close(approx, want, rtol=1e-6, atol=1e-9)


def _nonlinear(kind: str, h: int, w: int, seed: int, channels: int):
    if kind == "function_nonlinear":
        weights = torch.randn((channels, h, w), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return FunctionOperator(lambda x: torch.tanh(weights.to(x.dtype) * x) + x**3, (channels, h, w), (channels, h, w),
                                linear=False, dtype=torch.float64)
    params = {"kernel_size": 5, "boundary": "circular"} if kind == "deblur_camera" else {}
    return build_operator(kind, (h, w), seed=seed, **params)


@given(kind=st.sampled_from(NONLINEAR_KINDS), h=st.integers(4, 10).map(lambda v: 2 * v),
       w=st.integers(4, 10).map(lambda v: 2 * v), channels=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
@PROPERTY_SETTINGS
def test_nonlinear_jacobian_products_match_finite_differences(kind, h, w, channels, seed):
    """J v against central differences and <J v, u> = <v, J^T u>, away from the maps' kinks
    (x in [0.3, 0.7]: no clipping in HDR, sRGB's curves on their power branch); the linearisation's
    shapes, and the Gauss-Newton prox lowers its objective from its start."""
    op = _nonlinear(kind, h, w, seed, channels)
    g = torch.Generator().manual_seed(seed)
    x = 0.3 + 0.4 * torch.rand((2, channels, h, w), generator=g, dtype=torch.float64)
    v = torch.randn(x.shape, generator=g, dtype=torch.float64)
    eps = 1e-6
    fd = (op.A(x + eps * v) - op.A(x - eps * v)) / (2 * eps)
    jv = op.jvp(x, v)
    torch.testing.assert_close(jv, fd, atol=1e-6 * float(fd.abs().max()) + 1e-9, rtol=1e-5)
    u = torch.randn(jv.shape, generator=g, dtype=torch.float64)
    lhs, rhs = float((jv * u).sum()), float((v * op.vjp(x, u)).sum())
    assert abs(lhs - rhs) <= 1e-9 * max(abs(lhs), 1.0)
    lin = op.linearize(x)
    assert tuple(lin.A(v).shape) == tuple(op.measurement_shape(x.shape)) == tuple(op.A(x).shape)
    assert tuple(op.image_shape(op.A(x).shape)) == tuple(x.shape)
    y = op.A(0.3 + 0.4 * torch.rand(x.shape, generator=g, dtype=torch.float64))
    sigma, r = 0.05, 0.2

    def objective(z):
        return float(((y - op.A(z)) ** 2).sum() / (2 * sigma**2) + ((z - x) ** 2).sum() / (2 * r**2))

    assert objective(op.prox(y, x, sigma, r)) < objective(x)


def test_nonlinear_operators_refuse_an_adjoint_and_clip_where_they_say():
    hdr = build_operator("hdr", (8, 8))
    x = torch.linspace(0, 1, 64, dtype=torch.float64).view(1, 1, 8, 8)
    with pytest.raises(TypeError, match="nonlinear: it has no adjoint"):
        hdr.A_adjoint(x)
    grad = hdr.vjp(x, torch.ones_like(x))
    clipped = (2 * x - 0.5 <= 0) | (2 * x - 0.5 >= 1)
    assert bool((grad[clipped] == 0).all()) and bool((grad[~clipped] == 2).all())
    pr = build_operator("phase_retrieval", (16, 16))
    assert pr.measurement_shape((1, 3, 16, 16)) == (1, 3, 24, 24)
    with pytest.raises(ValueError, match="is the padded grid of no image"):
        pr.image_shape((1, 3, 4, 24))
    z = torch.rand(1, 1, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(pr.A(z), pr.A(z.flip(-1, -2)))  # the 180-degree twin
