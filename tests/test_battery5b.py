"""The fifth reliability battery (issue 51), its deepinv user's items: F5, a nonlinear or complex
physics at the bridge; F6, deepinv's Denoising restored as denoising; F10, the docs' deepinv
snippet in deepinv's current spelling. Each failed before its fix."""

from __future__ import annotations

import pytest
import torch
from test_interop import SIGMA_MAX, FakeBlurPhysics, FakeDenoiser, GaussianNoise, PoissonNoise, image
from torch import nn

from nfc_dps.interop import DeepinvSolver, from_deepinv_denoiser, from_deepinv_physics

# deepinv's class tree by name and module (nothing imports deepinv)


class Physics(nn.Module):
    __module__ = "deepinv.physics.forward"


class LinearPhysics(Physics):
    __module__ = "deepinv.physics.forward"


class PhaseRetrieval(Physics):
    """deepinv's PhaseRetrieval shape: A(x) = |B x|^2 with B complex; A_adjoint is B's adjoint."""
    __module__ = "deepinv.physics"

    def __init__(self, shape=(1, 8, 8), m=200):
        super().__init__()
        n = shape[0] * shape[1] * shape[2]
        gen = torch.Generator().manual_seed(3)
        self.shape = shape
        self.register_buffer("B", torch.randn((m, n), generator=gen, dtype=torch.complex64) / n**0.5)

    def A(self, x):
        return (x.flatten(1).to(torch.complex64) @ self.B.T).abs().square()

    def A_adjoint(self, y):
        return (y.to(torch.complex64) @ self.B.conj()).view(-1, *self.shape)


class RandomPhaseRetrieval(PhaseRetrieval):
    __module__ = "deepinv.physics"


class Squares(Physics):
    """A deepinv Physics (not linear) that still has an A_adjoint attribute."""

    def A(self, x):
        return x**2

    def A_adjoint(self, y):
        return y


class ComplexAdjoint(nn.Module):
    """A duck-typed physics whose adjoint is complex."""

    def A(self, x):
        return x

    def A_adjoint(self, y):
        return y.to(torch.complex64)


class Denoising(LinearPhysics):
    """deepinv's Denoising: A = A^T = I, a noise model."""
    __module__ = "deepinv.physics"

    def __init__(self, noise_model):
        super().__init__()
        self.noise_model = noise_model

    def A(self, x):
        return x

    def A_adjoint(self, y):
        return y

    def forward(self, x):
        return self.noise_model(x)


# -- F5


@pytest.mark.parametrize("physics", [PhaseRetrieval(), RandomPhaseRetrieval()])
def test_deepinv_phase_retrieval_is_refused_at_the_bridge_naming_the_route(physics) -> None:
    for call in (lambda: from_deepinv_physics(physics),
                 lambda: DeepinvSolver(from_deepinv_denoiser(FakeDenoiser(), SIGMA_MAX))(torch.rand(1, 200), physics)):
        with pytest.raises(ValueError, match="phase retrieval, y = \\|B x\\|\\^2: nonlinear") as e:
            call()
        assert "build_operator('phase_retrieval'" in str(e.value) and "linear=False" in str(e.value)


def test_a_nonlinear_deepinv_physics_with_an_adjoint_is_refused() -> None:
    with pytest.raises(ValueError, match="Squares is a deepinv Physics that is not a LinearPhysics.*linear=False"):
        from_deepinv_physics(Squares())


def test_a_complex_adjoint_names_the_route() -> None:
    op = from_deepinv_physics(ComplexAdjoint())
    with pytest.raises(TypeError, match="complex tensor.*FunctionOperator\\(physics.A"):
        op.A_adjoint(torch.rand(1, 3, 8, 8))


def test_the_route_runs_deepinv_phase_retrieval_as_a_nonlinear_map() -> None:
    from nfc_dps.operators import FunctionOperator

    physics = PhaseRetrieval()
    op = FunctionOperator(physics.A, (1, 8, 8), (200,), linear=False)
    assert not op.is_linear and op.A(torch.rand(2, 1, 8, 8)).shape == (2, 200)


# -- F6


@pytest.mark.parametrize("noise, kw", [(GaussianNoise(0.05), {}), (PoissonNoise(0.05), {})])
def test_deepinv_denoising_is_restored_as_the_built_in_denoising(noise, kw) -> None:
    import nfc_dps

    physics = Denoising(noise)
    x = image(16, 16)
    y = physics(x)
    prior = from_deepinv_denoiser(FakeDenoiser(), SIGMA_MAX)
    out = DeepinvSolver(prior, **kw)(y, physics)
    model = getattr(noise, "gain", None)
    ref = nfc_dps.restore(y, nfc_dps.build_operator("denoise", image_size=(16, 16)), prior=prior,
                          progress=False, **({"noise": f"poisson:{1 / model:g}"} if model else {"sigma_y": 0.05}))
    torch.testing.assert_close(out, ref.image)


def test_a_blur_is_not_taken_for_denoising() -> None:
    from nfc_dps.interop import is_identity_physics

    y = torch.rand(1, 3, 8, 8)
    assert not is_identity_physics(FakeBlurPhysics(), y) and is_identity_physics(Denoising(GaussianNoise(0.1)), y)


def test_a_torchvision_that_breaks_diffusers_is_named_with_the_fix(monkeypatch):
    """F4: a torchvision built for another torch makes diffusers' import fail with 'operator
    torchvision::nms does not exist'; loading a prior names torchvision and the fix."""
    import builtins

    from nfc_dps.priors.default import load_prior

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "diffusers" or name.startswith("diffusers."):
            raise RuntimeError("operator torchvision::nms does not exist")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(ImportError, match=r"torchvision .* does not match torch .*pip uninstall torchvision"):
        load_prior()


def test_the_deepinv_snippet_builds_its_kernel_as_deepinv_now_does():
    """F10: docs/bring_your_own.md's deepinv example took its kernel from
    ``dinv.physics.blur.gaussian_blur``, which deepinv replaced by
    ``dinv.physics.functional.gaussian_blur`` (its docs and examples); that one makes a 1-D kernel
    of a float sigma, so the snippet passes a pair."""
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "bring_your_own.md").read_text()
    snippets = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "import deepinv" in b]
    assert snippets and "physics.blur.gaussian_blur" not in text
    calls = re.findall(r"dinv\.physics\.functional\.gaussian_blur\(sigma=([^)]*\))", "".join(snippets))
    assert calls and all(c.startswith("(") for c in calls), calls
