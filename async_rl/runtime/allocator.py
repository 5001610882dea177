"""The C memory allocator of learner ranks and actors (``async_training.cpu_allocator``): tcmalloc where it is found.

On CPU every activation, gradient and collective buffer of a step is a fresh ``malloc``. glibc's allocator keeps what
a step frees in a fragmented heap, so a learner rank's resident memory grows over the first steps to about twice
what is live; tcmalloc reuses those blocks. On the SmolLM2 recipe's step (2 FSDP2 ranks, AVX2 host) tcmalloc cut
the peak resident memory per rank from about 4.1 GB to 2.5 GB and was no slower (docs/architecture.md, "The
learner", Memory).

A library must be loaded before the process starts (``LD_PRELOAD``), so an entry point started without it re-runs
itself once with it (:func:`reexec_with_allocator`): the same process id, arguments and environment, so torchrun,
SLURM and the local launcher see nothing change. vLLM's engine processes, started from an actor, inherit it; vLLM
recommends tcmalloc on CPU and warns without it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from async_rl.config.names import CpuAllocator

logger = logging.getLogger(__name__)

# Debian/Ubuntu's libtcmalloc-minimal4, gperftools' full library, and what conda or a prefix may hold
LIBRARY_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so")
SYSTEM_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib64",
)
REEXEC_MARK = "ASYNC_RL_ALLOCATOR_REEXEC"  # set in the re-run process: never re-run twice
INSTALL_HINT = "apt-get install libtcmalloc-minimal4 (Debian/Ubuntu), dnf install gperftools-libs, or conda gperftools"


def search_dirs(env: Mapping[str, str]) -> list[str]:
    """Where to look: this interpreter's prefix, ``$CONDA_PREFIX``, then the system's library directories."""
    dirs = [str(Path(sys.prefix) / "lib")]
    if env.get("CONDA_PREFIX"):
        dirs.append(str(Path(env["CONDA_PREFIX"]) / "lib"))
    return [*dirs, *SYSTEM_DIRS]


def find_tcmalloc(dirs: Sequence[str]) -> str | None:
    """The first tcmalloc library in ``dirs`` (names in :data:`LIBRARY_NAMES` order within each directory)."""
    for d in dirs:
        for name in LIBRARY_NAMES:
            path = Path(d) / name
            if path.is_file():
                return str(path)
    return None


def preloaded(env: Mapping[str, str]) -> bool:
    """Whether ``LD_PRELOAD`` already loads a tcmalloc."""
    return "libtcmalloc" in env.get("LD_PRELOAD", "")


def preload_env(env: Mapping[str, str], library: str) -> dict[str, str]:
    """``env`` with ``library`` first in ``LD_PRELOAD`` and the re-run mark set."""
    current = env.get("LD_PRELOAD", "")
    return {**env, "LD_PRELOAD": f"{library}:{current}" if current else library, REEXEC_MARK: "1"}


def plan_allocator(choice: CpuAllocator, env: Mapping[str, str], dirs: Sequence[str]) -> tuple[str | None, str, bool]:
    """The library to re-run with (None: keep this process as it is), a line saying what was chosen and why, and
    whether that line is a warning.

    ``choice``: ``auto`` (tcmalloc when a library is found, else the system malloc), ``tcmalloc`` (an error when no
    library is found) or ``system`` (leave the process alone)."""
    if choice == "system":
        return None, "allocator: the system malloc (async_training.cpu_allocator=system)", False
    if preloaded(env):
        return None, f"allocator: tcmalloc (LD_PRELOAD={env['LD_PRELOAD']})", False
    if env.get(REEXEC_MARK):  # re-run once already and it did not take: say so, do not loop
        line = "allocator: the system malloc (LD_PRELOAD of tcmalloc did not take effect)"
        if choice == "tcmalloc":
            raise RuntimeError(f"async_training.cpu_allocator=tcmalloc: {line}")
        return None, line, True
    library = find_tcmalloc(dirs)
    if library is None:
        where = ", ".join(dirs)
        if choice == "tcmalloc":
            raise FileNotFoundError(
                f"async_training.cpu_allocator=tcmalloc: no {' or '.join(LIBRARY_NAMES)} in {where}; {INSTALL_HINT}"
            )
        return (
            None,
            (
                "allocator: the system malloc, no tcmalloc found (async_training.cpu_allocator=auto); on CPU, learner"
                f" ranks then need more memory (1.6x the peak on the SmolLM2 recipe); {INSTALL_HINT}"
            ),
            True,
        )
    return library, f"allocator: tcmalloc ({library})", False


def child_env(choice: CpuAllocator, env: Mapping[str, str], dirs: Sequence[str]) -> tuple[dict[str, str], str, bool]:
    """The environment for a child process that should run on the allocator ``choice`` plans (``LD_PRELOAD`` of the
    library found in ``dirs`` when one is to be loaded), the line saying which, and whether that line is a warning.
    For processes that are not entry points (the tuner's probes): they measure what a run's ranks would."""
    library, line, warn = plan_allocator(choice, env, dirs)
    return (dict(env) if library is None else preload_env(env, library)), line, warn


def reexec_with_allocator(choice: CpuAllocator, entry: Sequence[str], *, announce: bool) -> None:
    """Re-run ``python <entry> <this process's arguments>`` (``entry``: ``["-m", module]`` for an entry point, or a
    tool's script path) with tcmalloc preloaded when ``choice`` asks for it and it is not loaded yet (does not return
    then); otherwise log (when ``announce``) which allocator this process uses. Call it before any thread starts."""
    library, line, warn = plan_allocator(choice, os.environ, search_dirs(os.environ))
    if library is None:
        if announce:
            logger.log(logging.WARNING if warn else logging.INFO, "%s", line)
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    argv = [sys.executable, *entry, *sys.argv[1:]]
    os.execve(sys.executable, argv, preload_env(os.environ, library))
    raise AssertionError("unreachable")  # pragma: no cover - execve does not return


__all__ = [
    "child_env",
    "find_tcmalloc",
    "plan_allocator",
    "preload_env",
    "preloaded",
    "reexec_with_allocator",
    "search_dirs",
]
