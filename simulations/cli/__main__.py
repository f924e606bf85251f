"""``python -m simulations.cli``: the ``fedvalue`` command."""

import sys

from simulations.cli.main import main

sys.exit(main())
