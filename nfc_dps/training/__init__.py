"""Training EDM diffusion priors on the package photos or on a folder of one's own images.

``nfc-dps train-prior`` (nfc_dps/cli/train_prior.py) calls :func:`train_prior`:

* :mod:`.data` - image pools, the held-out split, device-side crops (:class:`CropSampler`);
* :mod:`.loop` - :class:`TrainConfig`, :func:`train_prior` (EDM loss, EMA, budgets, progress);
* :mod:`.state` - the resumable ``state.pt`` and the work folder's configuration check;
* :mod:`.export` - the prior folder :func:`nfc_dps.load_prior` reads, and the held-out PSNR;
* :mod:`.args` - the command-line flags of ``nfc-dps train-prior``.
"""

from .config import TrainConfig, TrainResult
from .data import TrainingError
from .loop import train_prior

__all__ = ["TrainConfig", "TrainResult", "TrainingError", "train_prior"]
