"""How a learner-side process starts from its config tree, reports and exits."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import msgspec

from async_rl.config.cli import parse_tree_cli

T = TypeVar("T", bound=msgspec.Struct)


def tree_main(
    root: type[T],
    validate: Callable[[T], list[str]],
    argv: Sequence[str] | None,
    *,
    dry_run: Callable[[T], int],
    run: Callable[[T], dict[str, Any]],
) -> int:
    """A supervised job's command line: parse and validate ``root``'s tree (bad keys exit 2 naming them),
    ``--dry-run`` and ``--print-config``, quiet ranks other than 0, then ``run`` and :func:`report` its summary."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg, flags = parse_tree_cli(root, validate, argv, exit_on_error=True)
    if flags.dry_run:
        return dry_run(cfg)
    if flags.print_config:
        return 0
    if os.environ.get("RANK", "0") != "0":
        logging.getLogger().setLevel(logging.WARNING)  # one rank's log lines are enough
    return report(run(cfg))


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
