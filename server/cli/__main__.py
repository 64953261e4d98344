"""`python -m server.cli ...`: the `vigil` command from a checkout (a worktree whose package is not installed)."""

import sys

from server.cli.main import main

sys.exit(main())
