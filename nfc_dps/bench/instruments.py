"""Instruments of the benchmark harness: the machine's description, peak memory of a block,
LPIPS (optional), a results row's image metrics, and 8-bit PNG output of images."""

from __future__ import annotations

import contextlib
import io
import os
import platform
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..io import atomic_write_bytes
from ..metrics import restoration_metrics


def save_png(path: Path, img: Tensor | np.ndarray) -> None:
    """(C, H, W) tensor or (H, W[, C]) array in [0, 1] -> 8-bit PNG, atomically."""
    from PIL import Image

    a = img.detach().cpu().float().numpy() if isinstance(img, Tensor) else np.asarray(img, dtype=np.float32)
    if isinstance(img, Tensor):
        a = np.moveaxis(a, 0, -1)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    buf = io.BytesIO()
    Image.fromarray((np.clip(a, 0, 1) * 255 + 0.5).astype(np.uint8)).save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())


def machine_description() -> dict[str, Any]:
    """The machine timings ran on: nproc, CPU model and capability (the SIMD level torch uses), RAM,
    python and torch versions, torch's CPU threads, the load average (1, 5, 15 min) now, GPU (if any)."""
    info: dict[str, Any] = {"nproc": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                            "torch_threads": torch.get_num_threads(),
                            "load_average_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    with contextlib.suppress(AttributeError):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["ram_gib"] = round(int(line.split()[1]) / 2**20, 1)
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


class PeakMemory:
    """Peak memory of a block in MB. CUDA: torch.cuda.max_memory_allocated (allocator peak,
    minus the allocation at entry). CPU: peak resident set size above the level at entry, by
    polling /proc/self/statm every 5 ms (falls back to the ru_maxrss delta elsewhere)."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.mb: float | None = None

    @staticmethod
    def resident_bytes() -> int | None:
        """This process's resident set size in bytes (/proc/self/statm; None where it is missing)."""
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._base = self.resident_bytes()
        self._peak = self._base or 0
        self._stop = threading.Event()
        if self._base is None:
            import resource

            self._maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return self

        def poll() -> None:
            while not self._stop.wait(0.005):
                r = self.resident_bytes()
                if r is not None and r > self._peak:
                    self._peak = r

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
            return
        if self._base is None:
            import resource

            self.mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self._maxrss0) / 1024
            return
        self._stop.set()
        self._thread.join()
        r = self.resident_bytes()
        if r is not None:
            self._peak = max(self._peak, r)
        self.mb = max(0.0, (self._peak - self._base) / 2**20)


# LPIPS (optional)

_LPIPS_CACHE: dict[str, Any] = {}


def lpips_status() -> tuple[bool, str]:
    """(available, why): LPIPS needs the ``lpips`` package and AlexNet weights already on disk."""
    import importlib.util

    for mod in ("lpips", "torchvision"):
        if importlib.util.find_spec(mod) is None:
            return False, f"LPIPS not computed: {mod} is not installed (optional; nothing is downloaded)"
    import lpips as _lp

    lin = Path(_lp.__file__).parent / "weights" / "v0.1" / "alex.pth"
    hub = Path(torch.hub.get_dir()) / "checkpoints"
    backbone = sorted(hub.glob("alexnet-*.pth")) if hub.is_dir() else []
    if not lin.is_file() or not backbone:
        return False, f"LPIPS not computed: AlexNet weights not on disk (expected {lin} and {hub}/alexnet-*.pth)"
    return True, "LPIPS (AlexNet, lpips package) on [-1, 1] images"


def _lpips(x: Tensor, ref: Tensor) -> float | None:
    """Mean LPIPS of (B, C, H, W) images in [0, 1]; None when LPIPS is unavailable."""
    ok, _ = lpips_status()
    if not ok:
        return None
    key = str(x.device)
    if key not in _LPIPS_CACHE:
        import lpips

        _LPIPS_CACHE[key] = lpips.LPIPS(net="alex", verbose=False).to(x.device).eval()
    with torch.no_grad():
        return float(_LPIPS_CACHE[key](x.float() * 2 - 1, ref.float() * 2 - 1).mean())


def row_metrics(x: Tensor, ref: Tensor) -> dict[str, float | None]:
    """A results row's numbers for restoration ``x`` of ground truth ``ref`` ((1, C, H, W), [0, 1]):
    PSNR / SSIM / MSE of x clipped to [0, 1] (:func:`nfc_dps.metrics.restoration_metrics`) and
    LPIPS when available (else None)."""
    out = restoration_metrics(x, ref)
    out["lpips"] = _lpips(x.detach().cpu().double().clamp(0, 1).float(), ref.detach().cpu().float())
    return out
