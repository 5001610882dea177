"""A quick exit for the actor's vLLM child processes (its EngineCore and workers), loaded as a vLLM general plugin.

Stopping a CPU engine took about 5 s, every time: after its shutdown, each vLLM child spends seconds in the
interpreter's teardown (a cyclic garbage collection over everything torch and vLLM imported), the worker about 2 s
and the EngineCore longer, so vLLM's 5 s grace ran out and it SIGKILLed the EngineCore. Every actor stop, restart
and test paid it. vLLM knows the cost (it freezes the heap before exit on ROCm); freezing it here leaves objects
that native extensions then report as leaked at teardown. This plugin skips the teardown instead: after the child's
own shutdown and the other exit handlers registered after it have run, it flushes the logs and streams and ends the
process with ``os._exit`` and the exit code the process was leaving with. The kernel frees the memory as it would.

vLLM loads the plugins of the ``vllm.general_plugins`` entry-point group in every process it starts (this package
declares :func:`register` there). It does something only where :data:`ENV` is ``1`` (:func:`arm`: the actor and the
tuner's probes set it for their engines; other vLLM users of this environment are left alone) and only in a
multiprocessing child: the process that built the engine exits as it always did.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import sys
from typing import NoReturn

ENV = "ASYNC_RL_VLLM_QUICK_EXIT"

_exit_code = 0
_registered = False
_real_sys_exit = sys.exit


def arm() -> None:
    """Ask for the quick exit in the vLLM engines this process starts from now on (their children inherit
    :data:`ENV`)."""
    os.environ[ENV] = "1"


def register() -> None:
    """The plugin's entry point (vLLM calls it once or more per process): arm the quick exit where :data:`ENV` is 1
    in a multiprocessing child."""
    global _registered
    if _registered or os.environ.get(ENV) != "1" or multiprocessing.parent_process() is None:
        return
    _registered = True
    sys.exit = _recording_exit  # a spawned child leaves through spawn_main's sys.exit(exitcode)
    atexit.register(_quick_exit)  # registered after vLLM's imports: runs before their exit handlers


def _recording_exit(code: str | int | None = None) -> NoReturn:
    global _exit_code
    _exit_code = exit_status(code)
    _real_sys_exit(code)


def exit_status(code: object) -> int:
    """The status the interpreter gives ``sys.exit(code)``: 0 for ``None``, the integer itself, else 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def _quick_exit() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to write
            pass
    os._exit(_exit_code)
