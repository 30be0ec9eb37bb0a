"""The ``nfc-dps`` command line (also ``python -m nfc_dps``), one module per subcommand.

    nfc-dps demo                                   # 2 held-out photos x 3 tasks (--tasks all: 5), grid + metrics
    nfc-dps simulate --input clean/ --output sim/ --config configs/deblur_gaussian.yaml
    nfc-dps restore --config sim/simulation.json --output out/         # inputs + GT from sim/
    nfc-dps restore --input y/ --output out/ --task sr_bicubic --gt gt/ --samples 4
    nfc-dps calibrate --images clean/ --task sr_bicubic --preset fast --samples 4 --out cal.json
    nfc-dps convert-adm ffhq_10m.pt priors/ffhq --preset ffhq256
    nfc-dps train-prior --workdir runs/mine --images photos/ --minutes 60 --export priors/mine
    nfc-dps prior-report --prior priors/mine --out prior_report.json
    nfc-dps bench --protocol local                 # nfc_dps.bench (docs/benchmarks.md); bench report: the docs' tables

Modules: ``parser`` (the parser and :func:`main`: exit statuses), one per subcommand (``demo``,
``restore``, ``simulate``, ``calibrate``, ``convert_adm``, ``train_prior``, ``prior_report``,
``bench``), and what they share: ``common`` (exit codes, UsageError, log, device / prior set-up,
seeds, metrics), ``flags`` (shared arguments), ``tasks`` (task and sampler resolution, per-image
operators), ``preflight`` (setup checks on the first image, notes on inputs), ``outputs`` (output
folder checks, the lock, output names, full-disk errors) and ``records`` (restore's manifest.json,
results.csv and summary.json).

Exit status: 0 all done; 1 some image failed; 2 usage or setup error, or a full output disk;
130 interrupted (Ctrl-C), 143 terminated (SIGTERM) (see :mod:`nfc_dps.cli.parser`). Every file is
written atomically.
"""

from .common import image_seed, noise_seed
from .parser import build_parser, main

__all__ = ["main", "build_parser", "image_seed", "noise_seed"]
