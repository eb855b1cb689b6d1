"""The one way a `python -m jobs.<name>` command runs its `main`: a user's mistake is one clear line.

A bad argument, a missing path or a malformed file (ValueError and OSError from the checks that run
before any compute) prints `error: <message>` on stderr and exits 1, without a traceback that buries
it; `--debug` anywhere on the command line, or COCOLM_DEBUG=1, shows the traceback instead. Every
other exception is a fault, not a usage error, and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

DEBUG_FLAG = "--debug"
DEBUG_ENV = "COCOLM_DEBUG"
USER_ERRORS = (ValueError, OSError)


def run_main(main: Callable[[list[str]], Any], argv: list[str] | None = None) -> None:
    """Call `main(argv)` (argv without --debug); turn a user error into one line and exit status 1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    argv = [a for a in argv if a != DEBUG_FLAG]
    try:
        main(argv)
    except USER_ERRORS as error:
        if debug:
            raise
        print(f"error: {error}\n(the traceback: add {DEBUG_FLAG} or set {DEBUG_ENV}=1)", file=sys.stderr)
        raise SystemExit(1) from None
