"""``python -m pgstore.bench``."""

import sys

from . import main

sys.exit(main())
