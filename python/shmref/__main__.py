# SPDX-License-Identifier: MIT
"""``python -m shmref doctor [--socket PATH]``: which shmrefd this process would use, why,
and its limits (pid and uid, pool size, your quota). It runs ``shmrefctl which``, the
wheel's (beside libshmref, the library the extension uses), else the one on PATH, so
Python and C apply one rule (libshmref's client-lib/autostart.c). It starts nothing."""
from __future__ import annotations

import os
import shutil
import sys

USAGE = "usage: python -m shmref doctor [--socket PATH]"


def _shmrefctl() -> str:
    from . import daemon
    try:
        return daemon.path("shmrefctl")
    except FileNotFoundError:
        found = shutil.which("shmrefctl")
        if not found:
            sys.exit("python -m shmref doctor: no shmrefctl in this installation nor on PATH")
        return found


def main(argv: list[str]) -> None:
    args = argv[1:]
    if not argv or argv[0] != "doctor" or not (args == [] or (len(args) == 2 and args[0] == "--socket")):
        sys.exit(USAGE)
    exe = _shmrefctl()
    os.execv(exe, [exe, *argv[1:], "which"])


if __name__ == "__main__":
    main(sys.argv[1:])
