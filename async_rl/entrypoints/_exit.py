"""How a finished learner-side process reports and exits."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import Any, NoReturn


def report(summary: dict[str, Any]) -> int:
    """A learner's exit status from its run summary: 128 + SIGTERM when a signal stopped it (a checkpoint was written
    where checkpointing is on), else 0 after printing the summary (rank 0's; the other ranks' is empty) as one json
    line, without the last step's metrics."""
    if summary.get("stopped"):
        return 128 + signal.SIGTERM
    if summary:
        print(json.dumps({k: v for k, v in summary.items() if k != "last"}, default=str))
    return 0


def exit_without_finalization(code: int) -> NoReturn:
    """Flush the logs and streams, then ``os._exit(code)``: everything is written and the process group destroyed,
    and interpreter finalization is where gloo's worker threads can abort a finished rank ("terminate called without
    an active exception", a torch/gloo teardown race)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass  # the reader is gone (torchrun and the launcher were killed): exit all the same
    os._exit(code)
