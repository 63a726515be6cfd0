# SPDX-License-Identifier: MIT
"""The wheel's shmrefd and shmrefctl: ``shmrefd ...``, ``shmrefctl ...`` (console entries)
and ``python -m shmref.daemon ...`` run the programs shipped in ``shmref/bin``.

You rarely need to start shmrefd yourself: when no daemon answers at the default socket,
``shmref.connect()`` (libshmref's connect) starts a private one for your user, which
exits after ``$SHMREF_IDLE_EXIT_S`` (60) seconds with nothing held. See docs/install.md.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

BIN = Path(__file__).resolve().parent / "bin"


def path(name: str = "shmrefd") -> str:
    """The wheel's program `name` (shmrefd or shmrefctl); FileNotFoundError if this
    installation has none (a build linked to a system libshmref)."""
    p = BIN / name
    if not os.access(p, os.X_OK):
        raise FileNotFoundError(f"{p}: this shmref installation carries no {name} (built with "
                                "SHMREF_LIBRARY=system? then use the system's)")
    return str(p)


def _exec(name: str, argv: list[str]) -> None:
    try:
        exe = path(name)
    except FileNotFoundError as e:
        sys.exit(f"{name}: {e}")
    os.execv(exe, [exe, *argv])


def main() -> None:
    _exec("shmrefd", sys.argv[1:])


def ctl_main() -> None:
    _exec("shmrefctl", sys.argv[1:])


if __name__ == "__main__":
    main()
