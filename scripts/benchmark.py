#!/usr/bin/env python
"""Benchmarks: PSNR/SSIM tables against the peers and classical baselines, NFE curves, timing,
the Gaussian oracle and a per-NFE profile. A thin wrapper of :func:`nfc_dps.bench.cli.main`;
see docs/benchmarks.md for the commands.

    python scripts/benchmark.py --protocol local --budgets 20,50,100
    torchrun --nproc_per_node=4 scripts/benchmark.py --protocol paper --images DIR --prior DIR
"""

import sys

from nfc_dps.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
