"""Package data of nfc_dps, installed as ``nfc_dps._assets`` (pyproject.toml maps this folder there).

``default_prior/`` is the embedded default prior that :func:`nfc_dps.load_prior` loads when given no
path; :func:`nfc_dps.priors.default.default_prior_path` finds it through ``importlib.resources``, so
editable and regular (wheel) installs read the same folder layout.
"""
