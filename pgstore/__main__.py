"""``python -m pgstore``: the ``pgstore`` command."""

from __future__ import annotations

import sys

from pgstore.cli.commands import main

sys.exit(main())
