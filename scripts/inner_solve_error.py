"""Error of NFC's exact inner step at a conjugate-gradient cap, against a 400-iteration solve.

For each annealing level of a 10-level NFC run at 256 x 256 (the profile's schedule), solves the
inner Gaussian-conditional step with the cap and with 400 iterations (the reference also stops
at CG's 1e-5 relative residual, so a 0 means the capped solve stopped there too), and prints the RMS
difference in units of the noise the next level adds (the last level: its own sigma). Rows: the
preconditioner in use (``wide holes``) and the Fourier-diagonal form it replaced (no hole counts
as wide). The centre is the clean image plus 0.3 sigma of noise, a stand-in for the predictor's
x0_hat; the prior covariance is the embedded prior's declared spectrum.

    python scripts/inner_solve_error.py --tasks inpaint_box,inpaint_random,sr4
"""

from __future__ import annotations

import argparse
import dataclasses
from unittest import mock

import numpy as np
import torch

import nfc_dps.samplers.common as common
import nfc_dps.samplers.gaussian_step as gaussian_step
from nfc_dps.bench.spec import task_specs
from nfc_dps.operators import build_operator
from nfc_dps.priors.default import load_prior
from nfc_dps.samplers.nfc import band_weight, level_sigmas
from nfc_dps.samplers.presets import NFC_PRESETS


def level_errors(task: str, caps: list[int], levels: int, size: int, wide_holes: bool) -> np.ndarray:
    """(levels, len(caps)) RMS error / next level's sigma."""
    from skimage import data
    from skimage.transform import resize

    prior = load_prior()
    img = resize(data.astronaut() / 255.0, (size, size), anti_aliasing=True)
    x = torch.tensor(img, dtype=torch.float32).permute(2, 0, 1)[None]
    spec = task_specs("local", size, "circular")[task]  # the profile's tasks at this size
    op = build_operator(spec.factory_task, (size, size), **spec.params)
    g = torch.Generator().manual_seed(0)
    y = op.measure(x, 0.025, g)
    prob = common.to_model_units(op, y, 0.025, x.shape)
    spectrum = prior.spectrum(size, size).to(torch.float32).view(1, 1, size, size)
    cfg = NFC_PRESETS["fast"]
    sigmas = level_sigmas(dataclasses.replace(cfg, num_levels=levels), op, prob.sigma, prior.sigma_max)
    out = np.zeros((levels, len(caps)))
    hole_size = gaussian_step.WIDE_HOLE_SIZE if wide_holes else 10**9  # no hole is wide: the old form
    with mock.patch.object(gaussian_step, "WIDE_HOLE_SIZE", hole_size):
        for k in range(levels):
            sigma, sigma_next = sigmas[k], sigmas[k + 1]
            var = gaussian_step.spectral_prior_variance(spectrum, sigma)
            band = band_weight(cfg.band, k, levels, prob.y.shape, cfg.band.linear_cutoff(k, levels), None, torch.float32)
            centre = (2 * x - 1) + 0.3 * sigma * torch.randn(x.shape, generator=g)

            def solve(cap: int) -> torch.Tensor:
                return gaussian_step.gaussian_conditional(op, prob.y, centre, prob.sigma, var, torch.Generator().manual_seed(k),
                                                   band, sample=k < levels - 1, cg_iters=cap)

            ref = solve(400)
            scale = sigma_next if sigma_next > 0 else sigma
            out[k] = [float((solve(c) - ref).square().mean().sqrt()) / scale for c in caps]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="inpaint_box,inpaint_random,sr4")
    ap.add_argument("--caps", default="10,20,30,50", help="CG iteration caps to compare")
    ap.add_argument("--levels", type=int, default=10)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    caps = [int(c) for c in args.caps.split(",")]
    print(f"RMS inner-solve error / next level's sigma, worst level of {args.levels} ({args.size}^2, astronaut)")
    print("| task | preconditioner | " + " | ".join(f"{c} iterations" for c in caps) + " |")
    print("|---|---|" + "---|" * len(caps))
    for task in args.tasks.split(","):
        for wide in (True, False):
            err = level_errors(task, caps, args.levels, args.size, wide)
            label = "wide holes (current)" if wide else "Fourier-diagonal (before)"
            print(f"| {task} | {label} | " + " | ".join(f"{v:.2g}" for v in err.max(0)) + " |", flush=True)


if __name__ == "__main__":
    main()
