"""Shared test setup.

The tests use tiny tensors, where one thread is fastest and keeps the suite from fighting with
other jobs on a 2-core machine; it is set once for the whole session.
"""

import torch


def pytest_configure(config):
    torch.set_num_threads(1)
