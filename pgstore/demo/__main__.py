"""``python -m pgstore.demo``: ``make demo``."""

from __future__ import annotations

import sys

from pgstore.demo.run import main

sys.exit(main())
