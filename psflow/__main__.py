"""``python -m psflow`` is the ``psflow`` command."""

import sys

from psflow.cli.main import main

sys.exit(main())
