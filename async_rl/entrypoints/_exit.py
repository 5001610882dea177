"""How a finished learner-side process exits."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


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
