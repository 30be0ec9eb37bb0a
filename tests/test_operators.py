"""Linear operators: adjoints, pseudo-inverses, proximal solves, measurement noise, conventions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
from PIL import Image

from nfc_dps.operators import (
    TASKS,
    BlurOperator,
    ChannelDecomposition,
    Denoising,
    Inpainting,
    LinearOperator,
    SuperResolution,
    box_mask,
    build_operator,
    gaussian_kernel,
    load_mask,
    normal_equations_prox,
    random_mask,
)

SHAPES = [(2, 3, 32, 48), (1, 1, 40, 24)]

# An odd, non-square, asymmetric kernel (5 x 3), and an even one for convention checks.
_RNG = np.random.default_rng(123)
ODD_KERNEL = _RNG.uniform(0.2, 1.0, size=(5, 3))
EVEN_KERNEL = _RNG.uniform(0.2, 1.0, size=(4, 6))


def _blur_circ(h, w):
    return BlurOperator(ODD_KERNEL, "circular")


def _blur_refl(h, w):
    return BlurOperator(ODD_KERNEL, "reflect")


def _blur_gauss(h, w):
    return BlurOperator(gaussian_kernel(9, 1.2), "circular")


OPERATORS = {
    "blur_circular": _blur_circ,
    "blur_circular_gauss": _blur_gauss,
    "blur_reflect": _blur_refl,
    "sr_bicubic2": lambda h, w: SuperResolution(2, "bicubic"),
    "sr_bicubic4": lambda h, w: SuperResolution(4, "bicubic"),
    "sr_average4": lambda h, w: SuperResolution(4, "average"),
    "inpaint_box": lambda h, w: Inpainting(box_mask(h, w, box_size=(12, 10), margin=4, generator=1)),
    "inpaint_random": lambda h, w: Inpainting(random_mask(h, w, 0.7, generator=2)),
    "denoise": lambda h, w: Denoising(),
}
# operators whose pinv and prox run conjugate gradients (base class) rather than a closed form
CG_OPERATORS = {"blur_reflect"}

CASES = [(name, shape) for name in OPERATORS for shape in SHAPES]
IDS = [f"{n}-{'x'.join(map(str, s))}" for n, s in CASES]


def _make(name, shape):
    return OPERATORS[name](shape[-2], shape[-1])


def _rand(shape, seed, dtype=torch.float64):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _dot(a, b):
    return float((a * b).sum())


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# ---------------------------------------------------------------------------------------- generic
@pytest.mark.parametrize("name,shape", CASES, ids=IDS)
def test_shapes(name, shape):
    op = _make(name, shape)
    x = _rand(shape, 0)
    y = op.A(x)
    assert tuple(y.shape) == op.measurement_shape(shape)
    assert tuple(op.A_adjoint(y).shape) == tuple(shape) == op.image_shape(y.shape)
    assert tuple(op.A_pinv(y).shape) == tuple(shape)
    assert isinstance(op, LinearOperator)
    assert y.dtype == x.dtype


@pytest.mark.parametrize("name,shape", CASES, ids=IDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_adjoint(name, shape, dtype, tol):
    op = _make(name, shape)
    x = _rand(shape, 1, dtype) - 0.5
    y = _rand(op.measurement_shape(shape), 2, dtype) - 0.5
    ax, aty = op.A(x), op.A_adjoint(y)
    lhs, rhs = _dot(ax.double(), y.double()), _dot(x.double(), aty.double())
    scale = float(ax.norm() * y.norm())
    assert abs(lhs - rhs) <= tol * scale, (lhs, rhs)


@pytest.mark.parametrize("name,shape", CASES, ids=IDS)
def test_pinv(name, shape):
    """A A^+ A = A. Closed forms: exact up to round-off (1e-6; circular blur drops frequencies
    with |H| < sqrt(eps) max|H|, which bounds its error by ~1e-8; measured <= 4e-15). CG
    (reflect blur, the base class's 100 iterations on a 1e-8-ridge system): the fit is only as
    good as CG gets in 100 steps on an ill-conditioned system, measured 7e-4 here, 2e-3."""
    op = _make(name, shape)
    x = _rand(shape, 3)
    ax = op.A(x)
    tol = 2e-3 if name in CG_OPERATORS else 1e-6
    assert _rel(op.A(op.A_pinv(ax)), ax) < tol
    # the pseudo-inverse is a right inverse on the range, and A^+ y lies in range(A^T)
    if name not in CG_OPERATORS:
        xp = op.A_pinv(ax)
        assert _rel(op.A_pinv(op.A(xp)), xp) < tol


def _prox_grad(op, x, y, z, s, r):
    s2 = torch.as_tensor(s, dtype=x.dtype).reshape(-1, 1, 1, 1) ** 2
    r2 = torch.as_tensor(r, dtype=x.dtype).reshape(-1, 1, 1, 1) ** 2
    grad = op.A_adjoint(op.A(x) - y) / s2 + (x - z) / r2
    scale = op.A_adjoint(y) / s2 + z / r2
    return grad, scale


def _per_image(shape, values):
    return torch.tensor(values[: shape[0]], dtype=torch.float64)


SIGMAS = [
    pytest.param(0.1, 0.5, id="floats"),
    pytest.param(0.05, 3.0, id="small-sigma"),
    pytest.param("per-image", "per-image", id="per-image"),
]


@pytest.mark.parametrize("name,shape", CASES, ids=IDS)
@pytest.mark.parametrize("s,r", SIGMAS)
def test_prox_optimality(name, shape, s, r):
    op = _make(name, shape)
    if s == "per-image":
        s, r = _per_image(shape, [0.05, 0.3]), _per_image(shape, [2.0, 0.2])
    x_true = _rand(shape, 4)
    y = op.measure(x_true, 0.05, torch.Generator().manual_seed(5))
    z = _rand(shape, 6)
    # CG: enough iterations for the condition number (up to (r/s)^2 = 3600 here)
    x = op.prox(y, z, s, r, max_iter=500, tol=1e-9) if name in CG_OPERATORS else op.prox(y, z, s, r)
    grad, scale = _prox_grad(op, x, y, z, s, r)
    tol = 1e-5 if name in CG_OPERATORS else 1e-9
    assert float(grad.norm() / scale.norm()) < tol


@pytest.mark.parametrize("name,shape", [c for c in CASES if c[0] not in CG_OPERATORS],
                         ids=[i for c, i in zip(CASES, IDS) if c[0] not in CG_OPERATORS])
def test_closed_form_prox_matches_cg(name, shape):
    op = _make(name, shape)
    y = op.measure(_rand(shape, 7), 0.05, torch.Generator().manual_seed(8))
    z = _rand(shape, 9)
    s, r = _per_image(shape, [0.1, 0.4]), 0.7
    closed = op.prox(y, z, s, r)
    cg = normal_equations_prox(op, y, z, s, r, max_iter=1000, tol=1e-13)
    assert _rel(closed, cg) < 1e-8


@pytest.mark.parametrize("name", [n for n in OPERATORS if n not in CG_OPERATORS])
def test_prox_infinite_r_is_limit(name):
    """r = inf: the least-squares solution closest to z (the r -> inf limit): it fits the data
    (y is in the range here) and x - z lies in range(A^T) (A^+ A (x - z) = x - z)."""
    shape = SHAPES[0]
    op = _make(name, shape)
    y = op.A(_rand(shape, 10))
    z = _rand(shape, 11)
    x = op.prox(y, z, 0.1, math.inf)
    assert torch.isfinite(x).all()
    assert _rel(op.A(x), y) < 1e-6
    if not getattr(op, "is_circulant", False):  # circulant ones here are invertible
        assert _rel(op.A_pinv(op.A(x - z)), x - z) < 1e-6
    # and per image: an infinite r beside a finite one
    mixed = op.prox(y, z, 0.1, torch.tensor([math.inf, 0.5], dtype=torch.float64))
    assert torch.allclose(mixed[0], x[0]) and torch.allclose(mixed[1], op.prox(y, z, 0.1, 0.5)[1])


@pytest.mark.parametrize("name", [n for n in OPERATORS if n not in CG_OPERATORS])
def test_closed_form_prox_is_accurate_in_float32_at_large_r(name):
    """float32 against float64 at DDNM's r = 157 and beyond: a closed form must not amplify the
    round-off of its null space by r^2 (bicubic SR's did: errors of order 1 at r = 157)."""
    shape = (1, 3, 32, 32)
    op = _make(name, shape)
    x = _rand(shape, 12)
    y = op.measure(x, 0.05, torch.Generator().manual_seed(13))
    z = _rand(shape, 14)
    for r in (157.0, 1e6, math.inf):
        want = op.prox(y, z, 0.05, r)
        got = op.prox(y.float(), z.float(), 0.05, r).double()
        assert float((got - want).abs().max()) < 1e-4 * float(want.abs().max()), r


def test_circular_prox_at_infinite_r_keeps_z_where_the_kernel_passes_nothing():
    """A 2-tap box kernel has H = 0 at the Nyquist frequency: with r = inf (no prior term) that
    frequency is not determined by y; the r -> inf limit keeps z's, never NaN."""
    op = BlurOperator(np.array([[0.5, 0.5]]), "circular")
    z = _rand((1, 1, 4, 4), 15)
    y = op.A(_rand((1, 1, 4, 4), 16))
    x = op.prox(y, z, 0.1, math.inf)
    assert torch.isfinite(x).all()
    assert _rel(op.A(x), y) < 1e-9
    assert _rel(x, op.prox(y, z, 0.1, 1e12)) < 1e-6


@pytest.mark.parametrize("name", list(OPERATORS))
def test_prox_rejects_bad_scales(name):
    shape = SHAPES[0]
    op = _make(name, shape)
    z = _rand(shape, 0)
    y = op.A(z)
    with pytest.raises(ValueError, match="sigma_y.*0.0"):
        op.prox(y, z, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"r must be > 0.*-1"):
        op.prox(y, z, 0.1, torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"\(2,\) tensor"):
        op.prox(y, z, torch.ones(3), 1.0)


@pytest.mark.parametrize("name,shape", CASES, ids=IDS)
def test_measure_seeding(name, shape):
    op = _make(name, shape)
    x = _rand(shape, 12, torch.float32)
    a = op.measure(x, 0.05, torch.Generator().manual_seed(1))
    b = op.measure(x, 0.05, torch.Generator().manual_seed(1))
    c = op.measure(x, 0.05, torch.Generator().manual_seed(2))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(op.measure(x, 0.0), op.A(x))
    # per-image generators: image b's noise does not depend on the rest of the batch
    gens = [torch.Generator().manual_seed(100 + i) for i in range(shape[0])]
    full = op.measure(x, 0.05, gens)
    first = op.measure(x[:1], 0.05, [torch.Generator().manual_seed(100)])
    assert torch.equal(full[:1], first)
    # the noise has the requested std (where the operator keeps it)
    noise = (c - op.A(x))[op.A(torch.ones_like(x)) != 0] if name.startswith("inpaint") else c - op.A(x)
    assert abs(float(noise.std()) - 0.05) < 0.01


def test_measure_per_image_sigma_and_errors():
    op = BlurOperator(ODD_KERNEL)
    x = _rand((2, 1, 16, 16), 0)
    y = op.measure(x, torch.tensor([0.0, 0.1]), torch.Generator().manual_seed(0))
    assert torch.equal(y[0], op.A(x)[0])
    assert not torch.equal(y[1], op.A(x)[1])
    with pytest.raises(ValueError, match="sigma_y.*-0.1"):
        op.measure(x, -0.1)


def test_inpainting_measure_zero_outside_mask():
    mask = random_mask(16, 20, 0.5, generator=0)
    op = Inpainting(mask)
    y = op.measure(_rand((2, 3, 16, 20), 0), 0.1, torch.Generator().manual_seed(0))
    assert torch.all(y[:, :, mask == 0] == 0)
    assert torch.all(y[:, :, mask == 1] != 0)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_dc_response(name):
    op = _make(name, (1, 3, 32, 48))
    ones = torch.ones(1, 3, 32, 48, dtype=torch.float64)
    out = op.A(ones)
    if name.startswith("inpaint"):
        assert torch.equal(out[0, 0], op.mask[0, 0].double())
    else:
        assert torch.allclose(out, torch.ones_like(out), atol=1e-12)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_rejects_bad_images(name):
    op = _make(name, (1, 3, 32, 48))
    x = torch.rand(1, 3, 32, 48)
    with pytest.raises(ValueError, match=r"\(B, C, H, W\).*\(3, 32, 48\)"):
        op.A(x[0])
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        op.A(bad)
    with pytest.raises(TypeError, match="floating"):
        op.A(torch.ones(1, 3, 32, 48, dtype=torch.int64))


def test_gray_and_rgb_share_the_operator():
    """Channels are independent: an RGB image's channel c equals the gray operator on it."""
    for name in OPERATORS:
        op = _make(name, (1, 3, 32, 48))
        x = _rand((1, 3, 32, 48), 13)
        y = op.A(x)
        for c in range(3):
            assert torch.allclose(y[:, c: c + 1], op.A(x[:, c: c + 1]), atol=1e-12), name


# ---------------------------------------------------------------------------------------- blur
def _scipy_convolve(x, kernel, mode):
    x = x.double().numpy()
    k = np.asarray(kernel, dtype=np.float64)
    k = k / k.sum()
    out = np.empty_like(x)
    for b in range(x.shape[0]):
        for c in range(x.shape[1]):
            out[b, c] = ndi.convolve(x[b, c], k, mode=mode)
    return torch.from_numpy(out)


@pytest.mark.parametrize("kernel", [ODD_KERNEL, EVEN_KERNEL, np.asarray(gaussian_kernel(7, 1.0))], ids=["odd", "even", "gauss"])
@pytest.mark.parametrize("shape", [(2, 3, 20, 31), (1, 1, 9, 6)])
def test_reflect_blur_matches_scipy_mirror(kernel, shape):
    x = _rand(shape, 14, torch.float32)
    y = BlurOperator(kernel, "reflect").A(x)
    assert torch.allclose(y.double(), _scipy_convolve(x, kernel, "mirror"), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel", [ODD_KERNEL, EVEN_KERNEL], ids=["odd", "even"])
def test_circular_blur_matches_scipy_wrap(kernel):
    x = _rand((2, 3, 20, 31), 15, torch.float32)
    y = BlurOperator(kernel, "circular").A(x)
    assert torch.allclose(y.double(), _scipy_convolve(x, kernel, "grid-wrap"), atol=1e-5, rtol=0)


def test_reflect_matches_dps_reflection_pad():
    """Mirror padding = torch's ReflectionPad2d (DPS), with a symmetric kernel (DPS correlates)."""
    k = gaussian_kernel(5, 1.0)
    x = _rand((1, 2, 12, 15), 16)
    pad = torch.nn.functional.pad(x, (2, 2, 2, 2), mode="reflect")
    ref = torch.nn.functional.conv2d(pad, k.double().expand(2, 1, 5, 5), groups=2)
    assert torch.allclose(BlurOperator(k, "reflect").A(x), ref, atol=1e-12)


def test_kernel_larger_than_image():
    big = np.asarray(gaussian_kernel(15, 3.0))
    x = _rand((1, 2, 6, 9), 17, torch.float32)
    # circular wraps the kernel around the torus; reflect mirrors repeatedly, as scipy does
    for boundary, mode in (("circular", "grid-wrap"), ("reflect", "mirror")):
        op = BlurOperator(big, boundary)
        assert torch.allclose(op.A(x).double(), _scipy_convolve(x, big, mode), atol=1e-5, rtol=0), boundary
        y = _rand((1, 2, 6, 9), 18)
        xd = x.double()
        assert abs(_dot(op.A(xd), y) - _dot(xd, op.A_adjoint(y))) < 1e-10


def test_transfer_function():
    op = BlurOperator(ODD_KERNEL, "circular")
    H = op.transfer_function(20, 31)
    assert H.shape == (20, 31) and H.is_complex()
    assert op.transfer_function(20, 31) is H  # cached per shape
    x = _rand((1, 1, 20, 31), 19, torch.float32)
    ref = torch.fft.ifft2(H * torch.fft.fft2(x)).real
    assert torch.allclose(op.A(x), ref, atol=1e-6)
    assert op.is_circulant and not BlurOperator(ODD_KERNEL, "reflect").is_circulant
    assert abs(complex(H[0, 0]) - 1) < 1e-6  # DC gain 1
    with pytest.raises(ValueError, match="circular"):
        BlurOperator(ODD_KERNEL, "reflect").transfer_function(8, 8)


def test_blur_kernel_is_normalised():
    op = BlurOperator(ODD_KERNEL * 7.0)
    assert abs(float(op.kernel.sum()) - 1) < 1e-6
    assert op.kernel.dtype == torch.float32


@pytest.mark.parametrize("kernel,match", [
    (np.zeros((3, 3)), r"positive.*0\.0"),
    (-np.ones((3, 3)), r"positive.*-9\.0"),
    (np.array([[1.0, float("nan")]]), "NaN"),
    (np.ones((3, 3, 3)), r"2-D.*\(3, 3, 3\)"),
])
def test_blur_rejects_bad_kernels(kernel, match):
    with pytest.raises(ValueError, match=match):
        BlurOperator(kernel)


def test_blur_rejects_bad_boundary():
    with pytest.raises(ValueError, match="'wrap'"):
        BlurOperator(ODD_KERNEL, "wrap")


# ---------------------------------------------------------------------------------------- SR
def _keys(t):
    """Keys cubic, a = -0.5, written out piecewise (independent of the implementation)."""
    t = abs(t)
    if t <= 1:
        return 1.5 * t**3 - 2.5 * t**2 + 1
    if t < 2:
        return -0.5 * t**3 + 2.5 * t**2 - 4 * t + 2
    return 0.0


def _reflect_index(j, n):
    """MATLAB imresize border rule, by repeated reflection (..., 1, 0 | 0, 1, ..., n-1 | n-1, ...)."""
    while j < 0 or j >= n:
        j = -1 - j if j < 0 else 2 * n - 1 - j
    return j


def _reference_bicubic(img, s):
    """Per-pixel double loop: output (p, q) from input rows/cols around p*s + (s-1)/2."""
    H, W = img.shape
    out = np.zeros((H // s, W // s))
    for p in range(H // s):
        u = p * s + (s - 1) / 2
        rows = [(i, _keys((u - i) / s)) for i in range(math.floor(u - 2 * s), math.ceil(u + 2 * s) + 1)]
        rw = sum(w for _, w in rows)
        for q in range(W // s):
            v = q * s + (s - 1) / 2
            cols = [(j, _keys((v - j) / s)) for j in range(math.floor(v - 2 * s), math.ceil(v + 2 * s) + 1)]
            cw = sum(w for _, w in cols)
            acc = 0.0
            for i, wi in rows:
                for j, wj in cols:
                    acc += wi * wj * img[_reflect_index(i, H), _reflect_index(j, W)]
            out[p, q] = acc / (rw * cw)
    return out


@pytest.mark.parametrize("s,hw", [(2, (12, 18)), (4, (16, 24)), (3, (9, 6))])
def test_bicubic_matches_reference_loop(s, hw):
    img = np.random.default_rng(s).uniform(size=hw)
    ref = _reference_bicubic(img, s)
    out = SuperResolution(s, "bicubic").A(torch.from_numpy(img)[None, None])[0, 0].numpy()
    assert np.allclose(out, ref, atol=1e-12)


def test_bicubic_tap_count_and_interior_matches_pillow():
    op = SuperResolution(4, "bicubic")
    Dh, Dw = op.matrices(64, 48)
    assert Dh.shape == (16, 64) and Dw.shape == (12, 48)
    assert int((Dh[8] != 0).sum()) == 16  # 16 taps for x4 away from the border
    assert torch.allclose(Dh.sum(1), torch.ones(16, dtype=torch.float64))
    # Pillow's antialiased BICUBIC (a = -0.5, same centre mapping) differs only at borders
    img = np.random.default_rng(0).uniform(size=(64, 48)).astype(np.float32)
    pil = np.asarray(Image.fromarray(img, mode="F").resize((12, 16), Image.BICUBIC))
    ours = op.A(torch.from_numpy(img)[None, None])[0, 0].numpy()
    assert np.allclose(ours[2:-2, 2:-2], pil[2:-2, 2:-2], atol=1e-5)


def test_average_sr_is_block_mean():
    x = _rand((2, 3, 8, 12), 20)
    y = SuperResolution(2, "average").A(x)
    assert torch.allclose(y, x.reshape(2, 3, 4, 2, 6, 2).mean((3, 5)))


@pytest.mark.parametrize("factor", [2, 4, 8])
def test_sr_factors(factor):
    x = _rand((1, 1, 64, 32), 21)
    for method in ("bicubic", "average"):
        op = SuperResolution(factor, method)
        assert op.A(x).shape == (1, 1, 64 // factor, 32 // factor)


def test_sr_errors():
    with pytest.raises(ValueError, match=r"30x48.*factor 4"):
        SuperResolution(4).A(torch.rand(1, 3, 30, 48))
    with pytest.raises(ValueError, match=r"factor.*1"):
        SuperResolution(1)
    with pytest.raises(ValueError, match=r"factor.*2\.5"):
        SuperResolution(2.5)
    with pytest.raises(ValueError, match="'nearest'"):
        SuperResolution(2, "nearest")
    with pytest.raises(ValueError, match=r"\(1, 3, 8, 8\)"):
        op = SuperResolution(2, "average")
        op.prox(torch.rand(1, 3, 8, 8), torch.rand(1, 3, 8, 8), 0.1, 1.0)


# ---------------------------------------------------------------------------------------- inpainting
def test_box_mask():
    m = box_mask(64, 80, box_size=20, margin=8, generator=3)
    assert m.shape == (64, 80) and m.dtype == torch.float32
    assert int((m == 0).sum()) == 400
    rows, cols = torch.nonzero(m == 0, as_tuple=True)
    assert 8 <= int(rows.min()) and int(rows.max()) + 1 <= 64 - 8
    assert 8 <= int(cols.min()) and int(cols.max()) + 1 <= 80 - 8
    assert torch.equal(m, box_mask(64, 80, 20, 8, generator=3))
    assert torch.equal(m, box_mask(64, 80, 20, 8, generator=torch.Generator().manual_seed(3)))
    assert any(not torch.equal(m, box_mask(64, 80, 20, 8, generator=s)) for s in range(4, 8))


def test_box_mask_small_images():
    m = box_mask(40, 36, box_size=32, margin=16, generator=0)  # margins shrink to fit
    assert int((m == 0).sum()) == 32 * 32
    with pytest.raises(ValueError, match=r"box_size 128.*64x64"):
        box_mask(64, 64, 128, 16, generator=0)


def test_box_mask_position_is_uniform_over_dps_range():
    starts = {int(torch.nonzero(box_mask(48, 48, 16, 8, generator=s) == 0)[0, 0]) for s in range(200)}
    assert starts == set(range(8, 48 - 8 - 16))  # [margin, size - margin - box), as DPS


def test_random_mask():
    m = random_mask(30, 50, 0.7, generator=4)
    assert int((m == 0).sum()) == round(30 * 50 * 0.7)
    assert set(m.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(m, random_mask(30, 50, 0.7, generator=4))
    assert not torch.equal(m, random_mask(30, 50, 0.7, generator=5))
    assert int((random_mask(10, 10, 0.92, generator=0) == 0).sum()) == 92
    with pytest.raises(ValueError, match="1.5"):
        random_mask(10, 10, 1.5)


def test_mask_makers_leave_global_rng_alone():
    state = torch.random.get_rng_state()
    box_mask(32, 32, 8, 4, generator=1)
    random_mask(32, 32, 0.5, generator=1)
    assert torch.equal(state, torch.random.get_rng_state())


def test_inpainting_errors():
    op = Inpainting(torch.ones(1, 1, 16, 16))
    with pytest.raises(ValueError, match=r"\(16, 20\).*\(16, 16\)"):
        op.A(torch.rand(1, 3, 16, 20))
    with pytest.raises(ValueError, match=r"binary.*0\.5"):
        Inpainting(torch.full((4, 4), 0.5))
    with pytest.raises(ValueError, match=r"\(H, W\).*\(3, 4, 4\)"):
        Inpainting(torch.ones(3, 4, 4))
    with pytest.raises(ValueError, match="NaN"):
        Inpainting(torch.tensor([[1.0, float("nan")]]))
    assert not op.is_circulant


def test_inpainting_accepts_bool_and_numpy_masks():
    m = np.zeros((5, 6), dtype=bool)
    m[1:3] = True
    a = Inpainting(m)
    b = Inpainting(torch.from_numpy(m.astype(np.float32))[None, None])
    assert torch.equal(a.mask, b.mask) and a.mask.shape == (1, 1, 5, 6)


def test_load_mask(tmp_path):
    m = random_mask(12, 20, 0.5, generator=0)
    png = tmp_path / "mask.png"
    Image.fromarray((m.numpy() * 255).astype(np.uint8)).save(png)
    assert torch.equal(load_mask(png), m)
    npy = tmp_path / "mask.npy"
    np.save(npy, m.numpy() * 3)
    assert torch.equal(load_mask(npy), m)
    with pytest.raises(FileNotFoundError, match="nope.png"):
        load_mask(tmp_path / "nope.png")
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    with pytest.raises(ValueError, match="bad.png"):
        load_mask(bad)
    np.save(tmp_path / "cube.npy", np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match=r"cube.npy.*\(2, 3, 4\)"):
        load_mask(tmp_path / "cube.npy")


# ---------------------------------------------------------------------------------------- factory
def test_factory_builds_every_task(tmp_path):
    np.save(tmp_path / "k.npy", np.ones((3, 5)))
    np.save(tmp_path / "m.npy", np.ones((32, 48)))
    extra = {"inpaint_mask": {"mask_path": tmp_path / "m.npy"}, "deblur_kernel": {"kernel_path": tmp_path / "k.npy"},
             "inpaint_box": {"box_size": 16, "margin": 4}, "deblur_gaussian": {"kernel_size": 9},
             "deblur_motion": {"kernel_size": 9}, "deblur_camera": {"kernel_size": 9}}
    assert set(TASKS) >= {"sr_bicubic", "sr_average", "inpaint_box", "inpaint_random", "inpaint_mask",  # and any new one
                          "deblur_gaussian", "deblur_motion", "deblur_kernel", "denoise"}
    x = _rand((1, 3, 32, 48), 22)
    for task in TASKS:
        op = build_operator(task, (32, 48), seed=1, **extra.get(task, {}))
        assert isinstance(op, LinearOperator)
        y = op.A(x)
        assert tuple(y.shape) == op.measurement_shape(x.shape)
    assert build_operator("sr_bicubic", 32).A(x[..., :32]).shape[-1] == 8


def test_factory_defaults_and_seeds():
    op = build_operator("deblur_gaussian", (64, 64))
    assert op.kernel.shape == (61, 61) and op.boundary == "valid"
    a = build_operator("deblur_motion", 64, seed=3, kernel_size=15, boundary="reflect")
    b = build_operator("deblur_motion", 64, seed=3, kernel_size=15)
    c = build_operator("deblur_motion", 64, seed=4, kernel_size=15)
    assert a.boundary == "reflect" and torch.equal(a.kernel, b.kernel) and not torch.equal(a.kernel, c.kernel)
    m1 = build_operator("inpaint_random", (16, 16), seed=1).mask
    m2 = build_operator("inpaint_random", (16, 16), seed=2).mask
    assert not torch.equal(m1, m2)
    assert int((m1 == 0).sum()) == round(256 * 0.7)
    assert build_operator("sr_average", 64, factor=2).factor == 2


def test_factory_errors(tmp_path):
    with pytest.raises(ValueError, match=r"'deblur'.*sr_bicubic.*denoise"):
        build_operator("deblur", 64)
    with pytest.raises(ValueError, match=r"sigma.*kernel_size, kernel_std, boundary"):
        build_operator("deblur_gaussian", 64, sigma=2.0)
    with pytest.raises(ValueError, match="mask_path"):
        build_operator("inpaint_mask", 64)
    with pytest.raises(ValueError, match=r"60x60.*factor 8"):
        build_operator("sr_bicubic", 60, factor=8)
    np.save(tmp_path / "m.npy", np.ones((8, 8)))
    with pytest.raises(ValueError, match=r"m.npy.*\(8, 8\)"):
        build_operator("inpaint_mask", 16, mask_path=tmp_path / "m.npy")


def test_check_image_sum_overflow_is_not_an_error():
    """Finite images whose sum overflows pass (the exact fallback decides); NaN/Inf still fail."""
    from nfc_dps.operators.base import check_image

    big = torch.full((1, 1, 4, 4), 3e38)  # float32 sum overflows to inf
    check_image(big)
    check_image(torch.full((1, 3, 8, 8), 6e4, dtype=torch.float16))
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = big.clone()
        x[0, 0, 1, 2] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            check_image(x)


def test_mask_files_are_read_upright_like_the_images(tmp_path):
    """A mask saved by a camera app with an EXIF orientation lies on the image the way the image is
    read (nfc_dps.io applies the orientation to images; the mask reader applied none)."""
    from nfc_dps.io import read_image

    pixels = np.zeros((16, 16), np.uint8)
    pixels[:, :8] = 255  # left half observed, as stored
    img = Image.fromarray(pixels)
    exif = img.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    img.save(tmp_path / "mask.png", exif=exif)
    upright, _ = read_image(tmp_path / "mask.png")
    assert np.array_equal(load_mask(tmp_path / "mask.png").numpy(), (upright > 0.5).astype(np.float32))
    assert not np.array_equal(upright > 0.5, pixels > 0)  # the orientation does turn it


def test_conjugate_gradient_results_do_not_depend_on_the_batch():
    """Each image stops when it has converged, as it would alone: an easy system beside a hard one
    gets the same answer in the batch as on its own (it kept iterating before)."""
    from nfc_dps.operators.base import conjugate_gradient

    op = BlurOperator(gaussian_kernel(9, 2.0), "reflect")
    g = torch.Generator().manual_seed(0)
    b = torch.randn(3, 1, 24, 24, generator=g, dtype=torch.float64)
    scale = torch.tensor([1.0, 400.0, 10.0], dtype=torch.float64).view(3, 1, 1, 1)  # how ill-conditioned

    def apply(v):
        return op.normal(v) * scale[: v.shape[0]] + v

    together = conjugate_gradient(apply, b, torch.zeros_like(b), 60, 1e-6)
    for i in range(3):
        alone = conjugate_gradient(lambda v, i=i: op.normal(v) * scale[i] + v, b[i:i + 1], torch.zeros_like(b[i:i + 1]),
                                   60, 1e-6)
        # the two that converge: to rounding; the hard one runs all 60 iterations either way, where the
        # batched FFTs' rounding grows a little
        assert torch.allclose(together[i:i + 1], alone, rtol=0, atol=1e-12 if i != 1 else 1e-6), i


def test_channel_decomposition_is_the_svd_of_its_matrix():
    """A (2, 3) channel matrix applied per pixel: A x = U(d V^H x), V^H orthonormal, the pseudo-inverse
    is M^+ per pixel and the Gaussian mean solves its normal equations (r = inf: the least-squares
    solution closest to z)."""
    gen = torch.Generator().manual_seed(0)
    m = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    dec = ChannelDecomposition(m)
    x = torch.randn(2, 3, 4, 5, generator=gen, dtype=torch.float64)
    y = torch.randn(2, 2, 4, 5, generator=gen, dtype=torch.float64)
    d = dec.diagonal(4, 5, torch.float64)
    assert d.shape == (3, 1, 1) and float(d[-1]) == 0.0
    mix = lambda mat, v: torch.einsum("ij,bjhw->bihw", mat, v)  # noqa: E731
    torch.testing.assert_close(dec.U(d * dec.V_adjoint(x)), mix(m, x), rtol=0, atol=1e-12)
    torch.testing.assert_close(dec.V(dec.V_adjoint(x)), x, rtol=0, atol=1e-12)
    torch.testing.assert_close(dec.pinv(y), mix(torch.linalg.pinv(m), y), rtol=0, atol=1e-12)
    s2, r2 = torch.full((2, 1, 1, 1), 0.04, dtype=torch.float64), torch.full((2, 1, 1, 1), 0.5, dtype=torch.float64)
    got = dec.gaussian_mean(y, x, s2, r2)
    grad = mix(m.T, mix(m, got) - y) / s2 + (got - x) / r2
    assert float(grad.abs().max()) < 1e-10
    limit = dec.gaussian_mean(y, x, s2, torch.full_like(r2, math.inf))
    torch.testing.assert_close(mix(m, limit), y, rtol=0, atol=1e-12)
    torch.testing.assert_close(limit - x, mix(torch.linalg.pinv(m) @ m, limit - x), rtol=0, atol=1e-12)
    assert dec.gram_eigenvalues(4, 5).shape == (3 * 4 * 5,)
