"""A command whose reader went away (`robotd trace show … | head`): quiet, not a traceback.

Python ignores SIGPIPE, so a write to a closed pipe is a BrokenPipeError wherever it
happens. The command line entry points catch it once, at the top.
"""

from __future__ import annotations

import os
import sys

SIGPIPE_EXIT = 128 + 13  # what a shell reports for a process SIGPIPE ended


def reader_gone() -> int:
    """Point stdout at /dev/null (the interpreter's last flush at exit would fail again)
    and return the exit status a process ended by SIGPIPE has."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return SIGPIPE_EXIT
