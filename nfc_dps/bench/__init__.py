"""Benchmark protocols kept out of :mod:`nfc_dps.benchmark`, one module each (``mixture``: the
Gaussian-mixture oracle); the harness's command line dispatches to them."""
