"""``python -m pgstore.bench``."""

import sys

from pgstore.bench import main

sys.exit(main())
