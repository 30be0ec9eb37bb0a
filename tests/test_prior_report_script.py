"""scripts/prior_report.py: the training step it labels a prior with."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "prior_report.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("prior_report_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SAVED = time.time() - 60  # an export and a state written a minute ago (no save under way)


def _export(folder: Path, step: int | None) -> Path:
    (folder / "unet").mkdir(parents=True)
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(b"weights")
    os.utime(weights, (SAVED, SAVED))
    if step is not None:
        (folder / "train_info.json").write_text(json.dumps({"step": step}))
    return folder


def test_the_step_is_the_exports_own_even_beside_a_newer_work_folder_state(tmp_path):
    """A copied export in a work folder whose state.pt has moved on is labelled with the step its
    train_info.json records, not the state's."""
    report = _load_script()
    torch.save({"step": 6596}, tmp_path / "state.pt")
    os.utime(tmp_path / "state.pt", (SAVED, SAVED))
    _, info = report.snapshot_prior(_export(tmp_path / "export_copy", 6500), tmp_path / "snap1")
    assert info["step"] == 6500 and info["step_source"].endswith("train_info.json")
    # an export that records no step falls back to the state saved with it
    _, info = report.snapshot_prior(_export(tmp_path / "export_old", None), tmp_path / "snap2")
    assert info["step"] == 6596
