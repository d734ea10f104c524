"""How the command-line entry points report bad input: one line that names the fix, exit status 2.

Library code raises ``ValueError`` for input a user can correct (STYLE: errors say what to change);
the CLIs turn those into ``prove-decode: error: ...`` instead of a stack trace. ``HYDRA_FULL_ERROR=1``
(Hydra's own switch, which users of these Hydra CLIs already know) keeps the full traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def exit_on_user_error(prog: str) -> Iterator[None]:
    try:
        yield
    except ValueError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        print(f"{prog}: (HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(2) from None
