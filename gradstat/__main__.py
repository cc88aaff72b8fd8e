"""``python -m gradstat``: the ``gradstat`` command."""

import sys

from gradstat.analysis.cli.main import main

sys.exit(main())
