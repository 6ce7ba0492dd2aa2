"""The terminal: one console for results (stdout), one for progress, warnings and errors (stderr).
Piped output (logs, CI) gets room for the tables instead of the default 80 columns."""
from __future__ import annotations

import sys

from rich.console import Console

out = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 140)
