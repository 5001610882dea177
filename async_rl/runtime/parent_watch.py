"""Make a process leave when its parent dies, so no learner rank, actor or helper child is ever orphaned.

Why: every part of a job runs in a session of its own (torchrun starts each rank with ``start_new_session``, the
launcher each part, the actor its reward worker), so a signal to the parent's process group does not reach the child.
When the parent is SIGKILLed (a test, the OOM killer, the launcher's escalation), the child is re-parented to init
and would keep its GPU, its ports and its half-finished work forever.

:func:`watch_parent` uses two mechanisms:

1. Linux ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` (through ctypes): the kernel sends SIGTERM the moment the parent goes.
   Caveats: it fires when the parent *thread* that forked this process exits, not only the parent process (a child
   started from a worker thread gets the signal when that thread ends); it is cleared by fork and by exec of a
   set-uid binary; and a parent that died before this call is not noticed (the check below covers that only if the
   watch was set up before the parent died).
2. A daemon thread that polls ``os.getppid()`` against the parent seen at the call (every ``poll_s``): where prctl is
   missing (not Linux), or the signal was lost. It sends SIGTERM to this process, and if the process is still alive
   ``grace_s`` later it calls ``os._exit``.

SIGTERM lets a process with a SIGTERM handler stop in order (the learner checkpoints, see
:mod:`async_rl.runtime.graceful_stop`; vLLM's engine process shuts its workers down); without one, SIGTERM ends it at
once. ``forked_children=True`` also sets the watch up in every child this process later forks (``os.fork``, as
multiprocessing's default start method does: vLLM's engine and worker processes are forks of the actor), each against
the process that forked it; a SIGKILLed actor would otherwise leave them running. Children started by exec
(``subprocess``) are not covered: they call :func:`watch_parent` themselves. Not POSIX (Windows): a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
import time

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_watching: int | None = None  # the parent pid this process watches (one watch per process)
_fork_hook = False  # the at-fork hook is registered (once: a fork's own forks inherit it)


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the Linux kernel to send ``sig`` to this process when its parent thread exits; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return False
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    if prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


def _poll_parent(parent: int, sig: int, poll_s: float, grace_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(poll_s)
    name = signal.Signals(sig).name
    logger.warning("parent process %d is gone: sending %s to myself (pid %d)", parent, name, os.getpid())
    os.kill(os.getpid(), sig)
    time.sleep(grace_s)
    logger.error("still running %.1f s after the parent died: exiting now", grace_s)
    logging.shutdown()
    os._exit(128 + sig)


def watch_parent(
    *, grace_s: float = 5.0, poll_s: float = 1.0, sig: int = signal.SIGTERM, forked_children: bool = False
) -> bool:
    """Send ``sig`` to this process when its parent dies, and exit ``grace_s`` later if it is still alive.

    Call it early in a process's entry point. Returns True when watching, False where it is a no-op (not POSIX, or
    a process whose parent is already init). A second call in the same process changes nothing.
    """
    global _watching, _fork_hook
    if os.name != "posix":
        return False
    if grace_s < 0 or not poll_s > 0:
        raise ValueError(f"grace_s must be >= 0 and poll_s > 0, got grace_s={grace_s}, poll_s={poll_s}")
    if _watching is not None:
        return True
    if forked_children and not _fork_hook:  # even under init: the forks still watch this process

        def in_child() -> None:
            global _watching
            _watching = None  # the copy of the parent's state: this child has a parent of its own to watch
            watch_parent(grace_s=grace_s, poll_s=poll_s, sig=sig)

        os.register_at_fork(after_in_child=in_child)
        _fork_hook = True
    parent = os.getppid()
    if parent == 1:  # started by init (a container's entry process), or the parent is already gone: nothing to watch
        return False
    set_parent_death_signal(sig)
    if os.getppid() != parent:  # the parent died between getppid() and prctl(): the kernel will not tell us
        os.kill(os.getpid(), sig)
    _watching = parent
    threading.Thread(target=_poll_parent, args=(parent, sig, poll_s, grace_s), name="parent-watch", daemon=True).start()
    return True


__all__ = ["PR_SET_PDEATHSIG", "set_parent_death_signal", "watch_parent"]
