"""SIGTERM for a learner rank: stop at the next safe point, checkpoint if configured, and exit within a deadline.

Why not Python's default (die at once): a run stopped by its launcher (or by torchrun, which forwards SIGTERM to each
rank) should keep the steps it trained since its last checkpoint. Why not a plain ``signal.signal`` handler: Python
runs a handler only when the main thread is back in the interpreter, so a rank blocked in a collective (a weight
broadcast to an actor that just died, a peer rank that is gone) would never see it, and would outlive every deadline.

Order after SIGTERM (:class:`GracefulStop`):

1. Python's C-level handler writes the signal number to the wakeup fd at once, whatever the main thread is doing; a
   watcher thread reads it, sets the stop flag and starts the deadline (``async_training.timeouts.stop_s``);
2. the training loop checks :meth:`GracefulStop.agreed` before each step and every poll of its rollout wait; every
   rank takes part (a max all-reduce of the flags), so all ranks stop at the same step even if only one got the signal;
3. the loop writes a checkpoint if checkpointing is configured, closes the coordinator (actors are told to shut down),
   and the process exits ``128 + SIGTERM``;
4. if it has not exited when the deadline passes, the watcher thread logs that and calls ``os._exit`` (no checkpoint).

Only the main thread can install it; elsewhere :meth:`install` leaves signals alone and the flag is never set.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
from typing import Any

logger = logging.getLogger(__name__)


class StopRequested(Exception):
    """Raised on every rank by a loop that agreed to stop (see :meth:`GracefulStop.agreed`)."""


class GracefulStop:
    """A stop flag set by SIGTERM, with a hard deadline after which the process exits regardless."""

    def __init__(self, deadline_s: float, sig: int = signal.SIGTERM) -> None:
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.deadline_s = deadline_s
        self.sig = sig
        self._flag = threading.Event()
        self._requests = itertools.count()  # next() is atomic: the first caller of request() starts the deadline
        self._done = threading.Event()
        self._installed = False
        self._previous_handler: Any = None
        self._previous_fd = -1
        self._fds: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None

    @property
    def requested(self) -> bool:
        """True once this process got the signal (or :meth:`request` was called)."""
        return self._flag.is_set()

    def request(self) -> None:
        """Set the flag and start the deadline, as the signal does."""
        self._flag.set()
        if next(self._requests):
            return
        name = signal.Signals(self.sig).name
        logger.warning("%s: stopping at the next step boundary; exiting in at most %.1f s", name, self.deadline_s)
        threading.Thread(target=self._enforce_deadline, name="stop-deadline", daemon=True).start()

    def agreed(self, ctx: Any) -> bool:
        """Whether any rank was asked to stop. Collective when ``ctx`` is distributed: every rank must call it."""
        if not getattr(ctx, "is_distributed", False):
            return self.requested
        import torch

        return bool(ctx.all_reduce(torch.tensor([float(self.requested)]), "max").item() > 0)

    def install(self) -> GracefulStop:
        """Handle the signal (main thread only; elsewhere a no-op). Returns self."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return self
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._fds = (read_fd, write_fd)
        self._previous_handler = signal.signal(self.sig, self._on_signal)
        self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, args=(read_fd,), name="stop-watch", daemon=True)
        self._watcher.start()
        self._installed = True
        return self

    def close(self) -> None:
        """The process is about to exit (or the run is over): stop the deadline, restore the previous handler."""
        self._done.set()
        if not self._installed:
            return
        self._installed = False
        signal.set_wakeup_fd(self._previous_fd)
        signal.signal(self.sig, self._previous_handler)
        assert self._fds is not None
        read_fd, write_fd = self._fds
        os.close(write_fd)  # the watcher's read() returns b"" and it ends
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        os.close(read_fd)

    def _on_signal(self, _signum: int, _frame: object) -> None:
        self.request()  # usually already done by the watcher; the main thread just carries on to the next check

    def _watch(self, read_fd: int) -> None:
        while True:
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data:
                return
            if self.sig in data and not self._done.is_set():
                self.request()

    def _enforce_deadline(self) -> None:
        if self._done.wait(self.deadline_s):
            return
        name = signal.Signals(self.sig).name
        logger.error("did not stop within %.1f s of %s: exiting without a checkpoint", self.deadline_s, name)
        logging.shutdown()
        os._exit(128 + self.sig)


def step_outlasts_deadline(busy_s: float, deadline_s: float) -> str | None:
    """A SIGTERM is acted on at the end of the step it arrives in: the warning to give when a step's work (``busy_s``,
    the wait for rollouts excluded) outlasts the stop deadline, else None."""
    if busy_s <= deadline_s:
        return None
    return (
        f"a step took {busy_s:.1f} s, longer than async_training.timeouts.stop_s={deadline_s:.1f} s: a SIGTERM arriving"
        " mid-step would exit without a checkpoint. Raise stop_s above the step time plus a checkpoint's, and keep the"
        " launcher's grace (Slurm: KillWait, the partition's GraceTime, the --signal lead) above stop_s."
    )


__all__ = ["GracefulStop", "StopRequested", "step_outlasts_deadline"]
