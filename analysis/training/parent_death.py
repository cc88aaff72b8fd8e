"""A rank ends when the process that started it dies, so a killed launcher never leaves ranks training.

On Linux the kernel does it: ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` asks for SIGTERM when the parent exits (torch's
agent under ``torchrun``, gradstat's own launcher on one machine). The parent may already have died before the call;
the launcher's process id, when it passed one in :data:`LAUNCHER_PID`, tells (the orphan has been adopted by another
process then) and the rank exits at once. Elsewhere (no ``prctl``) nothing is armed and :func:`exit_with_parent`
returns False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
"""``prctl`` option number (linux/prctl.h)."""

LAUNCHER_PID = "GRADSTAT_LAUNCHER_PID"
"""Environment variable holding the launcher's process id, set by gradstat's single-machine launcher."""


def exit_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Arm the parent-death signal for this process; True where armed (Linux). Exits at once (status 1) when the
    launcher named in :data:`LAUNCHER_PID` is no longer this process's parent."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    expected = os.environ.get(LAUNCHER_PID)
    if expected and expected.isdigit() and os.getppid() != int(expected):
        print(f"gradstat rank: the launcher (pid {expected}) has already exited; stopping", file=sys.stderr)
        os._exit(1)
    return True
