"""Orphan protection: the worker must not outlive the engine that spawned it.

Two layers: prctl(PR_SET_PDEATHSIG, SIGKILL) on Linux (the kernel kills us when
the spawning thread's process goes away), and a daemon thread that polls
getppid() for the platforms or cases prctl does not cover. Set
BATON_NO_PDEATHSIG=1 to skip prctl, e.g. when the worker is spawned from a
short-lived thread (PDEATHSIG fires when that *thread* exits).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def _set_pdeathsig() -> None:
    if not sys.platform.startswith("linux") or os.environ.get("BATON_NO_PDEATHSIG") == "1":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the polling thread still covers us


def _watch_parent(parent: int, interval_s: float) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)  # no cleanup: the engine is gone, nobody is listening
        time.sleep(interval_s)


def protect_against_orphaning(interval_s: float = 0.5) -> None:
    parent = os.getppid()
    _set_pdeathsig()
    if parent == 1:
        return  # started by init (or already orphaned): nothing to watch
    threading.Thread(target=_watch_parent, args=(parent, interval_s), name="baton-orphan-watch", daemon=True).start()
