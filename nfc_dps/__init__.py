"""nfc_dps: image restoration with diffusion priors and noise-frequency continuation (NFC)."""

__version__ = "0.1.0"
