"""``nfc-dps restore``'s command line: its arguments and their help (the command itself is
:mod:`nfc_dps.cli.restore`)."""

from __future__ import annotations

import argparse

from .common import DEFAULT_MAX_BATCH, MAX_SAMPLES, STD_PNG_SCALE
from .flags import common_flags, prior_flags, sampler_flags, task_flags


def restore_arguments(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``restore`` subparser with every argument (its command is set by the caller)."""
    r = sub.add_parser(
        "restore", help="restore measurement images (a file or a folder)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Each input image is the measurement y of the task (for SR the output is factor x larger).\n"
                    "Outputs in --output:\n"
                    "  <name>.png            restoration (mean of the samples with --samples K > 1); input's bit depth;\n"
                    "                        a photograph's blur (boundary valid): the photo's frame, the input's size\n"
                    "                        (--keep-border: the whole scene; results.csv's extent says which)\n"
                    "                        an input's alpha channel is re-attached when the size is unchanged, dropped for SR\n"
                    f"  std/<name>.png|.npy   per-pixel posterior std (K > 1); PNG gray 1.0 = std {1 / STD_PNG_SCALE:g}\n"
                    "                        (the sampler's spread under the prior, not a calibrated error bar: see --calibration)\n"
                    "  samples/<name>_<j>.png  the K samples (--save-samples)\n"
                    "  <name>_lower.png, <name>_upper.png  the calibrated interval (--calibration; 16-bit, [0, 1])\n"
                    "  results.csv, summary.json  per-image status, seed, PSNR/SSIM (--gt), NFE, time; failures\n"
                    "  resolved_config.json  every setting, seeds and versions (reusable with --config; the prior\n"
                    "                        it names is chosen with --prior)\n"
                    "  manifest.json         finished images: a rerun skips them (resume); --overwrite redoes them\n"
                    "Each image's seed is a hash of --seed and its file name: adding or removing files changes no\n"
                    "other result. <name> is the input's stem, or stem_ext where inputs share a stem (a_png, a_jpg);\n"
                    "an input keeps the name an earlier run into the folder gave it, and no input takes another's\n"
                    "(a.png restored as a.png, then a.jpg added: a_jpg). Inputs whose output names would still\n"
                    "coincide (a.png and a.PNG), or whose interval would take another input's name (a.png's\n"
                    "a_lower.png beside an input a_lower.png, in this run or recorded by an earlier one), are refused\n"
                    "before any work. A run replaces only files that earlier nfc-dps runs into --output recorded:\n"
                    "a folder holding any other file of an output's name (the original photos, your own\n"
                    "results.csv) is refused before any work, naming it; --overwrite replaces such files. Images\n"
                    "in subfolders of --input are not restored (a warning counts them).")
    r.add_argument("--input", "-i", default=None,
                   help="measurement image or folder (default with a simulation.json config: its measurements)")
    r.add_argument("--output", "-o", required=True, help="output folder (not the input folder)")
    task_flags(r, "base seed (default 0); each image's seed is a hash of it and the image's file name")
    sampler_flags(r, "sampler preset. nfc: deterministic (default: the best estimate per network call, 16 NFE, "
                     "no random draw), fast (posterior samples, 100 NFE: use it with --samples K for a std map "
                     "that measures the posterior spread), fast_psnr, paper (as published, 1000 NFE); "
                     "other methods: fast (default), paper")
    prior_flags(r)
    r.add_argument("--kernel", default=None, metavar="FILE|DIR",
                   help="blur kernel (.npy or image) for all inputs, or a folder of kernels matched by file name")
    r.add_argument("--mask", default=None, metavar="FILE|DIR",
                   help="inpainting mask (white = observed) for all inputs, or a folder of masks matched by file name")
    r.add_argument("--samples", type=int, default=None, metavar="K",
                   help="posterior samples per image: writes their mean and a std map (default 1, at most "
                        f"{MAX_SAMPLES}); needs a sampling preset, e.g. --preset fast")
    r.add_argument("--save-samples", action="store_true", help="also write each sample (with --samples K)")
    r.add_argument("--keep-border", action="store_true",
                   help="a blur with boundary 'valid' (a photograph's): write the whole restored scene, the photo's "
                        "frame plus the band beyond it that the blur mixed in (default: the photo's own frame, "
                        "the input's size)")
    r.add_argument("--restarts", type=int, default=1, metavar="N",
                   help="run N chains per image and keep the one the measurement fits best (its likelihood; as DPS "
                        f"and DAPS report phase retrieval); needs a sampling method or preset (default 1, at most {MAX_SAMPLES})")
    r.add_argument("--calibration", default=None, metavar="FILE.json",
                   help="a file of 'nfc-dps calibrate' for this task, method, preset, K and prior: also writes the "
                        "calibrated interval <name>_lower.png / <name>_upper.png (docs/uncertainty.md)")
    r.add_argument("--batch-size", type=int, default=1, metavar="B",
                   help="restore up to B images of the same size (and operator) per sampler call: faster on a GPU; "
                        "each image keeps its own seed, so the results are those of B = 1, up to float rounding in "
                        "float32 (docs/scale.md) (default 1)")
    r.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help=f"at most N sampler chains (images x samples) at once: bounds memory with --samples K "
                        f"(default {DEFAULT_MAX_BATCH}, or B if larger). Results with --batch-size and --max-batch "
                        f"equal those of one image at a time up to float rounding of batched network layers")
    r.add_argument("--gt", default=None, metavar="DIR", help="ground-truth folder (same file names): PSNR/SSIM per image")
    r.add_argument("--bit-depth", type=int, choices=(8, 16), default=None, help="output bit depth (default: the input's)")
    r.add_argument("--overwrite", action="store_true",
                   help="redo images already done in the output folder, and replace files of the output names "
                        "that no earlier nfc-dps run wrote there")
    common_flags(r)
    return r
