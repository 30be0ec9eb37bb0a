"""Shared test setup.

The tests use tiny tensors, where one thread is fastest and keeps the suite from fighting with
other jobs on a 2-core machine: one torch thread for the whole run, restored after each test (a
command under test may set its own with --threads).
"""

import pytest
import torch


def pytest_configure(config):
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)
