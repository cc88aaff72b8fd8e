import sys

from analysis.cli.main import main

sys.exit(main())
