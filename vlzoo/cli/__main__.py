"""`python -m vlzoo.cli COMMAND ...`: the `vlzoo` command."""

import sys

from vlzoo.cli import main

sys.exit(main())
