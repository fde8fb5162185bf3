"""``python -m hpcdist ...`` is ``hpcdist ...``."""

import sys

from hpcdist.cli import main

sys.exit(main())
