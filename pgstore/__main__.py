"""``python -m pgstore``: the ``pgstore`` command."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
