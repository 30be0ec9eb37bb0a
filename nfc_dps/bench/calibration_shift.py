"""Calibrated intervals across sources of photographs: the draws (``python -m nfc_dps.bench.calibration_shift``).

A user calibrates on the photographs they have, not the ones they will restore. This protocol
restores tiles of several *sources* of images with the embedded prior, NFC's ``fast`` preset at
``budget`` NFE and K chains, for each task, and keeps every tile's draws, truth and measurement in
``OUT/chains/TASK_SOURCE.npz`` (one file per task and source, written when complete: a run that
stops resumes at the first missing file). Calibrating on one source and testing on another is then
done offline, for every rule, by :mod:`nfc_dps.bench.shift_rules`.

Sources (:data:`SOURCES`), ``count`` tiles each, a tile being a (size·zoom)-pixel crop
area-averaged to ``size`` px (:func:`nfc_dps.bench.calibration.photo_tiles`):

* ``heldout``: the four photographs held out of the prior's training
  (:data:`~nfc_dps.priors.training_data.HELDOUT_IMAGES`); the **test** source: never used to choose
  a rule or a setting;
* ``motorcycle``: scikit-image's stereo motorcycle, left then right view (neither trained on);
* ``leaves``: procedural textured dead leaves (:func:`nfc_dps.training.leaves.textured_leaves`);
* ``disks``: procedural plain dead leaves (:func:`nfc_dps.priors.training_data.dead_leaves`).

The measurement of a tile is the local protocol's task at ``size`` (:func:`~nfc_dps.bench.spec.task_specs`)
with Gaussian noise of std :data:`SIGMA_Y`, operator and noise seeded by the source and the tile's index.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..io import atomic_write_bytes
from ..operators import build_operator
from ..priors.default import load_prior
from ..priors.training_data import HELDOUT_IMAGES, dead_leaves
from ..restore_inputs import stable_seed
from ..samplers import Measurement, sample_chains
from ..training.leaves import textured_leaves
from .calibration import photo_tiles
from .spec import method_config, task_specs

__all__ = ["SOURCES", "TEST_SOURCES", "VALIDATION_SOURCES", "TASKS", "SIGMA_Y", "source_tiles", "sample_source",
           "load_source_chains", "main"]

SIGMA_Y = 0.025
TASKS = ("sr_bicubic", "inpaint_random", "deblur_gaussian")
SOURCES = ("heldout", "motorcycle", "leaves", "disks")
#: the sources whose figures are reported as test: never used to choose a rule or a setting
TEST_SOURCES = ("heldout",)
VALIDATION_SOURCES = tuple(s for s in SOURCES if s not in TEST_SOURCES)
PHOTOS = {"heldout": HELDOUT_IMAGES, "motorcycle": ("motorcycle_left", "motorcycle_right")}
GENERATORS: dict[str, Callable[[int, np.random.Generator], np.ndarray]] = {
    "leaves": textured_leaves, "disks": dead_leaves}
DEFAULT_COUNT = 16
DEFAULT_SIZE = 64
DEFAULT_BUDGET = 20
DEFAULT_SAMPLES = 4
ZOOM = 2


def source_tiles(source: str, count: int, size: int, seed: int = 0, zoom: int = ZOOM) -> list[tuple[str, np.ndarray]]:
    """``count`` images (name, (size, size, 3) float32 in [0, 1]) of ``source`` (module doc)."""
    if source in PHOTOS:
        return photo_tiles(PHOTOS[source], count, size, zoom)
    if source not in GENERATORS:
        raise ValueError(f"unknown source {source!r}; choose from {', '.join(SOURCES)}")
    out = []
    for i in range(count):
        img = GENERATORS[source](size * zoom, np.random.default_rng(stable_seed(seed, "shift", source, i)))
        out.append((f"{source}{i}", img.reshape(size, zoom, size, zoom, 3).mean((1, 3)).astype(np.float32)))
    return out


def _operator_seed(seed: int, task: str, source: str, index: int) -> int:
    return stable_seed(seed, "shift-operator", task, source, index)


def task_operator(task: str, size: int, seed: int, source: str, index: int):
    """The operator of tile ``index`` of ``source`` (random masks are drawn from its seed)."""
    spec = task_specs("local", size, "circular")[task]
    return build_operator(spec.name, size, _operator_seed(seed, task, source, index), **spec.params)


def sample_source(task: str, source: str, count: int, size: int, budget: int, k: int, seed: int,
                  log: Callable[[str], None] = print) -> dict[str, np.ndarray]:
    """One (task, source)'s arrays: ``chains`` (N, K, C, H, W) unclipped draws, ``truth`` (N, C, H, W),
    ``y`` (N, ...) the measurements, ``names`` (N,); float32, [0, 1] units."""
    cfg = method_config("nfc", "fast", budget)
    prior = load_prior(None, device=torch.device("cpu"))
    chains, truths, ys, names = [], [], [], []
    for i, (name, img) in enumerate(source_tiles(source, count, size, seed)):
        t0 = time.perf_counter()
        op = task_operator(task, size, seed, source, i)
        x = torch.from_numpy(np.ascontiguousarray(np.moveaxis(img, -1, 0)))[None].float()
        y = op.measure(x, SIGMA_Y, torch.Generator().manual_seed(stable_seed(seed, "shift-noise", task, source, i)))
        xs, _ = sample_chains("nfc", prior, Measurement(op, y, SIGMA_Y), cfg,
                              [stable_seed(seed, "shift-sampler", task, source, i)], num_samples=k)
        chains.append(xs.float().numpy())
        truths.append(x[0].numpy())
        ys.append(y[0].numpy())
        names.append(name)
        log(f"{task} {source} {i + 1}/{count} {name}: {time.perf_counter() - t0:.1f}s")
    return {"chains": np.stack(chains), "truth": np.stack(truths), "y": np.stack(ys), "names": np.array(names)}


def chains_path(out: Path, task: str, source: str) -> Path:
    return out / "chains" / f"{task}_{source}.npz"


def load_source_chains(out: Path, task: str, source: str) -> dict[str, np.ndarray]:
    """The arrays :func:`sample_source` saved for (task, source) under ``out``."""
    with np.load(chains_path(out, task, source)) as z:
        return {key: z[key] for key in z.files}


def run(out: Path, tasks: Sequence[str], sources: Sequence[str], count: int, size: int, budget: int, k: int,
        seed: int) -> None:
    """Sample every (task, source) whose file is missing under ``out`` (module doc)."""
    for task in tasks:
        for source in sources:
            path = chains_path(out, task, source)
            if path.is_file():
                print(f"{path}: done, kept", flush=True)
                continue
            arrays = sample_source(task, source, count, size, budget, k, seed, lambda s: print(s, flush=True))
            meta = np.array([f"task={task} source={source} size={size} budget={budget} k={k} seed={seed} "
                             f"sigma_y={SIGMA_Y} zoom={ZOOM} method=nfc preset=fast"])
            buffer = io.BytesIO()
            np.savez_compressed(buffer, meta=meta, **arrays)
            atomic_write_bytes(path, buffer.getvalue())
            print(f"wrote {path}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nfc_dps.bench.calibration_shift", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="a fresh folder (an existing one resumes)")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--sources", default=",".join(SOURCES))
    p.add_argument("--count", type=int, default=DEFAULT_COUNT, help="tiles per source")
    p.add_argument("--size", type=int, default=DEFAULT_SIZE)
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="NFE of NFC's fast preset")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="K chains per tile")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    run(a.out, a.tasks.split(","), a.sources.split(","), a.count, a.size, a.budget, a.samples, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
