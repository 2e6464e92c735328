"""``python -m validate.cli``: the command line (`validate.cli.main`)."""

import sys

from validate.cli.main import main

sys.exit(main())
