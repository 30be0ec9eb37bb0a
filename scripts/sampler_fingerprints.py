#!/usr/bin/env python
"""SHA-256 of every sampler's and baseline's output on fixed seeds: a refactor's bit-identity check.

Every method at every preset, and every classical baseline, restores one small measurement of
each task (32 x 32 gray and RGB, seed 0) with the exact Gaussian oracle prior and with a tiny
seeded EDM network; the float32 output bytes are hashed. Run before and after a change and
compare:

    python scripts/sampler_fingerprints.py --out /tmp/before.json
    python scripts/sampler_fingerprints.py --out /tmp/after.json --compare /tmp/before.json

``--compare`` exits 1 and lists every entry whose hash changed (or is missing); entries the earlier
file lacks (a method or task added since) are listed as new. Hashes are only comparable on one
machine and one torch build (float rounding differs across BLAS builds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

from nfc_dps import build_operator
from nfc_dps.baselines import CLASSICAL, NotApplicable, restore_classical
from nfc_dps.operators import TASKS as REGISTRY
from nfc_dps.priors.gaussian import GaussianSpectralPrior
from nfc_dps.samplers import METHODS, Measurement, get_config, sample_chains

#: every registered task that reads no file
TASKS = tuple(name for name, task in REGISTRY.items() if not task.reads)
SIZE = 32
SIGMA_Y = 0.025
# the paper presets run hundreds of steps; cap every preset at a few levels/steps for speed
STEP_FIELDS = ("num_levels", "num_steps")
STEP_CAP = 4


def _digest(x: torch.Tensor) -> str:
    return hashlib.sha256(x.detach().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()[:16]


def _tiny_network_prior(channels: int):
    from nfc_dps.priors.archs import build_unet
    from nfc_dps.priors.base import EDMDenoiser, TiledPrior
    from nfc_dps.priors.diffusers_prior import _UNetCall

    torch.manual_seed(0)
    net = build_unet("unet", channels=channels, widths=(8, 16), layers=1, sample_size=16)
    return TiledPrior(EDMDenoiser(_UNetCall(net.eval()), channels=channels), tile=16)


def fingerprints() -> dict[str, str]:
    out: dict[str, str] = {}
    torch.manual_seed(0)
    for channels in (1, 3):
        truth = torch.rand(1, channels, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
        priors = {"gaussian": GaussianSpectralPrior((SIZE, SIZE), channels=channels)}
        priors["net"] = _tiny_network_prior(channels)
        for task in TASKS:
            params = {"box_size": 12, "margin": 4} if task == "inpaint_box" else {}
            if task.startswith("deblur"):  # the boundary the entries were first taken with
                params = {"kernel_size": 9, "boundary": "circular"}
            op = build_operator(task, image_size=SIZE, seed=0, **params)
            if op.image_channels not in (None, channels):
                continue
            y = op.measure(truth, SIGMA_Y, generator=torch.Generator().manual_seed(2))
            for name in CLASSICAL:
                try:
                    x = restore_classical(name, op, y, SIGMA_Y)
                except NotApplicable:
                    continue
                out[f"c{channels}/{task}/{name}"] = _digest(x)
            for prior_name, prior in priors.items():
                for method, m in METHODS.items():
                    for preset in m.presets:
                        cfg = get_config(method, preset)
                        caps = {f: min(getattr(cfg, f), STEP_CAP) for f in STEP_FIELDS if hasattr(cfg, f)}
                        cfg = get_config(method, preset, **caps)
                        key = f"c{channels}/{task}/{prior_name}/{method}:{preset}"
                        try:
                            x, _ = sample_chains(method, prior, Measurement(op, y, SIGMA_Y), cfg, seeds=[3])
                        except (ValueError, NotImplementedError) as e:
                            out[key] = f"refused: {type(e).__name__}"
                            continue
                        out[key] = _digest(x)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON file of entry -> hash")
    ap.add_argument("--compare", type=Path, help="an earlier --out file to compare against")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result = fingerprints()
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"{len(result)} entries -> {args.out}")
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text())
    changed = sorted(k for k in before if before[k] != result.get(k))
    added = sorted(result.keys() - before.keys())
    for k in changed:
        print(f"changed: {k}: {before[k]} -> {result.get(k)}")
    for k in added:
        print(f"new: {k}: {result[k]}")
    print(f"{len(changed)} of {len(before)} entries changed" + (f"; {len(added)} new" if added else ""))
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
