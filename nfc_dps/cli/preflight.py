"""Checks of a run's setup on its first input image, so that a setup that would fail every image
is one usage error (exit 2) before any restoration: a method that cannot take the task's
operator or a measurement its operator cannot restore (before the prior loads), a prior whose channels do not fit the images or whose
network returns NaN/Inf (right after it loads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from .. import io as nio
from ..operators import TASKS
from ..operators.blur import KernelLargerThanMeasurement
from ..priors.base import prior_device
from ..samplers import get_method
from .common import UsageError, open_prior
from .tasks import OperatorSource


class FirstImage(NamedTuple):
    """The first input that reads: its path, its image (h, w[, C]) in [0, 1] and what
    :func:`nfc_dps.io.read_image` says of the file; for a task whose operator and measurement are
    read from the file (:func:`read_measurement`), ``image`` is that measurement and ``operator`` its
    operator."""

    path: Path
    image: Any
    info: Any
    operator: Any = None


def read_measurement(task_name: str, path: Path) -> tuple[Any, Any] | None:
    """(operator, measurement (h, w[, C]) float32 numpy) of the input file ``path`` for a task that
    reads both from the file (``Task.reads_measurement``: jpeg), else None. ImageReadError or
    ValueError naming the file when it holds no such measurement."""
    reads = TASKS[task_name].reads_measurement
    if reads is None:
        return None
    operator, y = reads(Path(path))
    a = y.detach().cpu().float()[0].permute(1, 2, 0).numpy()
    return operator, (a[..., 0] if a.shape[-1] == 1 else a)


def first_measurement(task_name: str, first: FirstImage | None) -> FirstImage | None:
    """``first`` with its measurement and operator read from the file when the task reads both from
    it; UsageError naming the file when it holds none (a PNG given to jpeg), before any work."""
    if first is None or TASKS[task_name].reads_measurement is None:
        return first
    try:
        operator, y = read_measurement(task_name, first.path)
    except (nio.ImageReadError, ValueError, OSError) as e:
        raise UsageError(str(e)) from e
    return first._replace(image=y, operator=operator)


def first_image(images: list[Path], any_range: bool = False) -> FirstImage | None:
    """The first of ``images`` that reads; None when none does (each unreadable image is then
    reported by name). ``any_range``: float values outside [0, 1] are read (restore's
    measurements: Fourier amplitudes, Poisson counts / peak), as each image is read later."""
    for path in images:
        try:
            return FirstImage(path, *nio.read_image(path, any_range=any_range))
        except (nio.ImageReadError, OSError):
            continue
    return None


def _operator_for(source: OperatorSource, name: str, image: Any, operator: Any = None) -> Any:
    """The task's operator built as for input ``name``, a measurement of ``image``'s size (``operator``
    where the file gave it); None when it cannot be built (the image's own operator error is
    reported with it)."""
    if operator is not None:
        return operator
    factor = source.factor()
    h, w = image.shape[:2]
    try:
        operator, _ = source.build(name, (h * factor, w * factor))
    except (ValueError, TypeError, OSError):
        return None
    return operator


def check_method_takes_operator(method: str, source: OperatorSource, name: str, image: Any, noise: Any = None,
                                config: Any = None, operator: Any = None) -> None:
    """UsageError when ``method`` (with ``config``) cannot restore the task's operator, built as for
    input ``name`` (``operator``: the one its file gave), under the noise model ``noise`` (None:
    the operator's own, where it declares one)."""
    operator = _operator_for(source, name, image, operator)
    if operator is None:
        return
    if noise is None:
        noise = operator.measurement_noise()
    problem = get_method(method).problem(method, operator, noise, config)
    if problem:
        raise UsageError(f"--method {method}: {problem}")


def check_measurement_fits(source: OperatorSource, name: str, path: Path, image: Any, operator: Any = None) -> None:
    """UsageError naming ``path`` when the task's operator, built as for input ``name`` (``operator``:
    the one its file gave), cannot restore a measurement of ``image``'s size: a valid-boundary blur
    whose kernel is larger than it, a phase retrieval measurement of a size no image's Fourier
    amplitudes have."""
    operator = _operator_for(source, name, image, operator)
    if operator is None:
        return
    h, w = image.shape[:2]
    try:
        operator.image_shape((1, 1 if image.ndim == 2 else image.shape[-1], h, w))
    except (KernelLargerThanMeasurement, ValueError) as e:
        raise UsageError(f"{path}: {e}") from e


def open_checked_prior(args: Any, device: Any, first: FirstImage | None) -> Any:
    """The prior of ``--prior`` and ``--precision`` on ``device``, checked against the first input
    (:func:`check_prior_fits`) when there is one."""
    prior = open_prior(args.prior, device, args.precision)
    if first is not None:
        check_prior_fits(prior, first.path.name, first.image)
    return prior


def check_prior_fits(prior: Any, name: str, image: Any) -> None:
    """UsageError when ``prior`` cannot restore ``image`` (input ``name``): an RGB image with a
    gray prior, or a network that returns NaN/Inf on a plain noisy input."""
    import torch

    channels = 1 if image.ndim == 2 else image.shape[-1]
    if prior.channels not in (channels, 3 if channels == 1 else -1):
        raise UsageError(f"the prior models {prior.channels}-channel images but {name} has {channels} channel(s)"
                         f"{' (convert the inputs to gray, or use an RGB prior)' if prior.channels == 1 else ''}")
    m = max(int(prior.size_multiple), 8)
    gen = torch.Generator().manual_seed(0)
    sigma = min(0.5, float(prior.sigma_max))
    x = sigma * torch.randn(1, prior.channels, m, m, generator=gen)
    x = x.to(prior_device(prior) or "cpu")
    with torch.no_grad():
        out = prior.denoise(x, torch.full((1,), sigma, device=x.device))
    if not torch.isfinite(out).all():
        raise UsageError(f"the prior returns NaN/Inf on a plain noisy {m}x{m} input at sigma {sigma:g} (model units): "
                         f"its weights are broken or it runs out of range in its precision ({prior.precision})")


#: below this many pixels a side a restoration has almost no context to work from
SMALL_IMAGE = 16


def input_notes(info: Any, image_hw: tuple[int, int], operator: Any) -> list[str]:
    """What a user should know about an input that is restored anyway: only its first page or
    frame is used, it is very small, or its blur kernel is larger than the image."""
    notes = []
    if getattr(info, "pages", 1) > 1:
        notes.append(f"only the first of its {info.pages} pages/frames is restored")
    h, w = image_hw
    if min(h, w) < SMALL_IMAGE:
        notes.append(f"the image is {h}x{w} pixels: too small for the prior to see much structure")
    kernel = operator.blur_kernel()
    if kernel is not None and (kernel.shape[-2] > h or kernel.shape[-1] > w):
        notes.append(f"the blur kernel ({kernel.shape[-2]}x{kernel.shape[-1]}) is larger than the image ({h}x{w})")
    return notes
