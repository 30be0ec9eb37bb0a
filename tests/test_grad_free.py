"""A user's network as the prior runs without gradients unless the method needs them (DPS), and
restore's results never carry an autograd graph (issue 43, N4). Tiny conv nets built here, 16 px."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from nfc_dps import restore
from nfc_dps.interop import DeepinvSolver, from_deepinv_denoiser
from nfc_dps.operators import build_operator
from nfc_dps.priors import DenoiserPrior, EDMDenoiser, EpsilonDenoiser

SIGMA_MAX = 50 / 255


class SmallDenoiser(nn.Module):
    """A residual 3 x 3 conv net, ``forward(x, sigma)`` in deepinv's convention; records, per
    call, whether autograd was on and whether its input required grad."""

    in_channels = 3

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.calls: list[tuple[bool, bool]] = []

    def forward(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        self.calls.append((torch.is_grad_enabled(), x.requires_grad))
        return x - 0.1 * sigma.view(-1, 1, 1, 1) * self.conv(x)


class SmallNet(nn.Module):
    """``net(x, t) -> (B, C, H, W)``, the raw network of EDMDenoiser / EpsilonDenoiser."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return 0.1 * self.conv(x)


def denoise_problem(size: int = 16, sigma_y: float = 0.05):
    op = build_operator("denoise", size)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    x = torch.stack([xx, yy, 0.5 + 0.3 * torch.sin(6 * xx)])[None]
    return x, op, op.measure(x, sigma_y, torch.Generator().manual_seed(0)), sigma_y


def priors():
    return [("DenoiserPrior", lambda net: DenoiserPrior(net, SIGMA_MAX)),
            ("from_deepinv_denoiser", lambda net: from_deepinv_denoiser(net, SIGMA_MAX))]


@pytest.mark.parametrize("method", ["nfc", "dpir"])
@pytest.mark.parametrize("name,make", priors())
def test_a_network_prior_restores_numpy_input(name, make, method):
    x, op, y, sigma_y = denoise_problem()
    net = SmallDenoiser().eval()
    out = restore(y[0].permute(1, 2, 0).numpy(), op, make(net), method=method, sigma_y=sigma_y, progress=False)
    assert isinstance(out.image, np.ndarray) and out.image.shape == (16, 16, 3)
    assert np.isfinite(out.image).all()


@pytest.mark.parametrize("method", ["nfc", "dpir"])
@pytest.mark.parametrize("name,make", priors())
def test_a_network_prior_runs_without_gradients_and_returns_no_graph(name, make, method):
    x, op, y, sigma_y = denoise_problem()
    net = SmallDenoiser().eval()
    out = restore(y, op, make(net), method=method, sigma_y=sigma_y, progress=False)
    assert not out.image.requires_grad and out.image.grad_fn is None
    assert net.calls and all(not grad_on for grad_on, _ in net.calls)


def test_dps_still_differentiates_through_a_network_prior():
    """DPS needs J^T of the network: its calls run with autograd on and an input that requires grad."""
    x, op, y, sigma_y = denoise_problem()
    net = SmallDenoiser().eval()
    diffusion = DenoiserPrior(net, 40.0, denoiser_only=False)  # a diffusion model's range
    out = restore(y, op, diffusion, method="dps", sigma_y=sigma_y, progress=False, num_steps=3)
    assert net.calls and all(grad_on and needs for grad_on, needs in net.calls)
    assert not out.image.requires_grad and torch.isfinite(out.image).all()


def test_the_prior_keeps_the_graph_when_its_input_requires_grad():
    net = SmallDenoiser().eval()
    prior = DenoiserPrior(net, SIGMA_MAX)
    x = (torch.rand(1, 3, 8, 8) * 2 - 1).requires_grad_(True)
    sigma = torch.tensor([0.2])
    out = prior.denoise(x, sigma)
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(g).all() and float(g.abs().sum()) > 0
    assert not prior.denoise(x.detach(), sigma).requires_grad  # autograd on, input without grad: no graph


@pytest.mark.parametrize("make", [
    lambda net: EDMDenoiser(net),
    lambda net: EpsilonDenoiser(net, torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)),
])
def test_network_wrappers_build_no_graph_for_an_eval_network_and_train_a_training_one(make):
    x = torch.rand(2, 3, 8, 8) * 2 - 1
    sigma = torch.tensor([0.5, 2.0])
    net = SmallNet().eval()
    assert not make(net).denoise(x, sigma).requires_grad  # a sampler's call
    net.train()  # a training loop differentiates with respect to the weights
    out = make(net).denoise(x, sigma)
    out.square().mean().backward()
    assert net.conv.weight.grad is not None and float(net.conv.weight.grad.abs().sum()) > 0


def test_deepinv_solver_returns_no_graph():
    x, op, y, sigma_y = denoise_problem()

    class Physics(nn.Module):
        def A(self, v):
            return v

        def A_adjoint(self, v):
            return v

    net = SmallDenoiser().eval()
    out = DeepinvSolver(from_deepinv_denoiser(net, SIGMA_MAX), sigma_y=sigma_y)(y, Physics())
    assert out.shape == x.shape and not out.requires_grad and out.grad_fn is None
