"""``nfc-dps prior-report`` (nfc_dps.bench.prior_report): the training step it labels a prior with, and
a run on a gray untiled prior."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from nfc_dps.bench import prior_report as report
from nfc_dps.cli import main

pytestmark = pytest.mark.slow  # runs the report on a network prior


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
    torch.save({"step": 6596}, tmp_path / "state.pt")
    os.utime(tmp_path / "state.pt", (SAVED, SAVED))
    _, info = report.snapshot_prior(_export(tmp_path / "export_copy", 6500), tmp_path / "snap1")
    assert info["step"] == 6500 and info["step_source"].endswith("train_info.json")
    # an export that records no step falls back to the state saved with it
    _, info = report.snapshot_prior(_export(tmp_path / "export_old", None), tmp_path / "snap2")
    assert info["step"] == 6596


def test_report_runs_on_a_gray_untiled_prior_and_whole_images(tmp_path):
    """A 1-channel prior is evaluated on the photos' luma, and an untiled network on images whose
    size is not its multiple (``--crop 0``: whole photos) is padded to it."""
    import numpy as np

    from nfc_dps import io as nio
    from nfc_dps.training import TrainConfig, train_prior

    images = tmp_path / "gray"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        nio.write_image(images / f"g{i}.png", rng.uniform(0, 1, (40, 40)), bit_depth=16)
    train_prior(TrainConfig(workdir=tmp_path / "w", images=images, export=tmp_path / "p", steps=1, arch="unet-pixelnorm",
                            widths=(8, 16), crop=16, batch=2, progress=False, eval_crop=32), log=lambda m: None)
    out = tmp_path / "report.json"
    assert main(["prior-report", "--prior", str(tmp_path / "p"), "--crop", "0", "--tune-crop", "24",
                 "--tune-per-image", "1", "--sigmas", "0.1", "--timing-runs", "1", "--no-overlap",
                 "--precision", "float32", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    text = json.dumps(rows)
    assert "NaN" not in text and "Infinity" not in text
    assert rows["prior"]["parameters"] > 0
    # the oracle TV row: each image's recorded best weight, its margin row in the report's markdown
    # and in the docs' table, and the acceptance flag that goes with it
    from nfc_dps.bench.report import prior_table

    each = rows["per_image"][rows["eval"]["images"][0]]["0.1"]
    assert each["tv_oracle_factor"] in report.TV_FACTORS and each["tv_oracle"] >= each["tv"]
    margin = rows["margin_over_tv_oracle"]["0.1"]
    assert rows["acceptance"]["strong_margin_over_tv_oracle"] == (margin >= report.STRONG_MARGIN_DB)
    assert f"**{margin:+.2f}**" in rows["markdown"].split("TV at its best weight per image** |")[1].splitlines()[0]
    assert "TV at its best weight per image** | " + f"**{margin:+.2f}** |" in prior_table(out, "")
    assert rows["machine"]["cpu_capability"] and "cpu" in rows["machine"]  # timings name their machine
    assert rows["command"].startswith("nfc-dps prior-report --prior ")  # the command that reproduces it


def test_a_missing_prior_folder_or_loss_log_is_a_usage_error(tmp_path, capsys):
    """A --prior or --loss-csv that does not exist is a one-line error with exit status 2."""
    assert main(["prior-report", "--prior", str(tmp_path / "none"), "--out", str(tmp_path / "r.json")]) == 2
    assert main(["prior-report", "--loss-only", "--loss-csv", str(tmp_path / "loss.csv")]) == 2
    err = capsys.readouterr().err
    assert "--prior" in err and "--loss-csv" in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()


class _Payload:
    """A pickle that runs code when unpickled: it writes the file it names."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_state_that_pickles_code_is_never_run_for_the_step_label(tmp_path):
    """An export without a step beside a state.pt saved with it: the state is read weights-only, so
    a payload in it does not run; the label says why it has no step."""
    marker = tmp_path / "payload_ran"
    torch.save({"step": 5, "evil": _Payload(marker)}, tmp_path / "state.pt")
    os.utime(tmp_path / "state.pt", (SAVED, SAVED))
    _, info = report.snapshot_prior(_export(tmp_path / "export", None), tmp_path / "snap")
    assert not marker.exists()
    assert info["step"] is None and "step_error" in info
