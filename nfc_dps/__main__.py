"""``python -m nfc_dps``: the nfc-dps command line."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
