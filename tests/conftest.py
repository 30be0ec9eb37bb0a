"""Shared test setup.

The tests use tiny tensors, where one thread is fastest and keeps the suite from fighting with
other jobs on a 2-core machine: one torch thread for the whole run, restored after each test (a
command under test may set its own with --threads).
"""

import json
from pathlib import Path

import pytest
import torch


def pytest_configure(config):
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_prior(tmp_path_factory) -> Path:
    """A tiny random EDM-parameterised diffusers UNet saved as a prior folder (16 px images)."""
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       norm_num_groups=4)
    root = tmp_path_factory.mktemp("prior")
    unet.save_pretrained(root / "unet")
    (root / "nfc_dps_prior.json").write_text(json.dumps({"parameterization": "edm"}))
    return root


@pytest.fixture(scope="session")
def prior_dir(tmp_path_factory) -> str:
    """A tiny, untrained diffusers UNet saved as an EDM prior (H, W multiples of 2)."""
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, block_out_channels=(8, 16),
                       norm_num_groups=4, layers_per_block=1,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
    path = tmp_path_factory.mktemp("prior")
    unet.save_pretrained(path)
    (path / "nfc_dps_prior.json").write_text(json.dumps({"parameterization": "edm"}))
    return str(path)
