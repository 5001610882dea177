"""The allocator choice (``async_training.cpu_allocator``): where tcmalloc is looked for, what each choice plans, and
a real re-run of an entry point with the library preloaded (same process id, the library mapped)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from async_rl.runtime.allocator import (
    REEXEC_MARK,
    child_env,
    find_tcmalloc,
    plan_allocator,
    preload_env,
    search_dirs,
)


def _lib(d: Path, name: str) -> str:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(b"\x7fELF")
    return str(d / name)


def test_find_takes_the_first_directory_then_the_minimal_library_first(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    _lib(second, "libtcmalloc_minimal.so.4")
    full = _lib(first, "libtcmalloc.so.4")
    minimal = _lib(first, "libtcmalloc_minimal.so.4")
    assert find_tcmalloc([str(first), str(second)]) == minimal
    os.unlink(minimal)
    assert find_tcmalloc([str(first), str(second)]) == full
    assert find_tcmalloc([str(tmp_path / "none")]) is None


def test_search_starts_with_this_prefix_and_conda():
    dirs = search_dirs({"CONDA_PREFIX": "/opt/conda"})
    assert dirs[:2] == [str(Path(sys.prefix) / "lib"), "/opt/conda/lib"]
    assert "/usr/lib/x86_64-linux-gnu" in dirs
    assert search_dirs({})[1] == "/usr/lib/x86_64-linux-gnu"


def test_preload_env_puts_the_library_first_and_marks_the_rerun():
    env = preload_env({"LD_PRELOAD": "/x/libgomp.so", "A": "1"}, "/l/libtcmalloc_minimal.so.4")
    assert env == {"LD_PRELOAD": "/l/libtcmalloc_minimal.so.4:/x/libgomp.so", "A": "1", REEXEC_MARK: "1"}
    assert preload_env({}, "/l/t.so")["LD_PRELOAD"] == "/l/t.so"


def test_plans(tmp_path):
    lib = _lib(tmp_path, "libtcmalloc_minimal.so.4")
    dirs, empty = [str(tmp_path)], [str(tmp_path / "none")]
    assert plan_allocator("auto", {}, dirs) == (lib, f"allocator: tcmalloc ({lib})", False)
    assert plan_allocator("tcmalloc", {}, dirs)[0] == lib
    # system: never touched, even with a library at hand
    assert plan_allocator("system", {}, dirs) == (
        None,
        "allocator: the system malloc (async_training.cpu_allocator=system)",
        False,
    )
    # already preloaded (by the user, or by the re-run): nothing to do
    library, line, warn = plan_allocator("auto", {"LD_PRELOAD": "/u/libtcmalloc.so.4"}, dirs)
    assert (library, warn) == (None, False) and "/u/libtcmalloc.so.4" in line
    # re-run once and still not loaded: warn, never loop
    library, line, warn = plan_allocator("auto", {REEXEC_MARK: "1"}, dirs)
    assert (library, warn) == (None, True) and "did not take effect" in line
    with pytest.raises(RuntimeError, match="cpu_allocator=tcmalloc: .*did not take effect"):
        plan_allocator("tcmalloc", {REEXEC_MARK: "1"}, dirs)
    # none found: auto warns with how to install it, tcmalloc refuses naming the key
    library, line, warn = plan_allocator("auto", {}, empty)
    assert (library, warn) == (None, True) and "apt-get install libtcmalloc-minimal4" in line
    with pytest.raises(FileNotFoundError, match=r"async_training.cpu_allocator=tcmalloc: no libtcmalloc_minimal"):
        plan_allocator("tcmalloc", {}, empty)


def test_a_child_env_preloads_what_the_plan_finds(tmp_path):
    lib = _lib(tmp_path, "libtcmalloc_minimal.so.4")
    env, line, warn = child_env("auto", {"A": "1"}, [str(tmp_path)])
    assert env == {"A": "1", "LD_PRELOAD": lib, REEXEC_MARK: "1"}
    assert (line, warn) == (f"allocator: tcmalloc ({lib})", False)
    assert child_env("system", {"A": "1"}, [str(tmp_path)])[0] == {"A": "1"}
    env, line, warn = child_env("auto", {"A": "1"}, [str(tmp_path / "none")])
    assert env == {"A": "1"} and warn and "no tcmalloc found" in line


PROBE = """
import os, sys
from async_rl.runtime.allocator import reexec_with_allocator
print("pid", os.getpid(), sys.argv[1:], flush=True)
reexec_with_allocator(sys.argv[1], ["-m", "allocprobe"], announce=True)
maps = open("/proc/self/maps").read()
print("mapped", "libtcmalloc" in maps, os.environ.get("LD_PRELOAD", ""), flush=True)
"""


def _probe(tmp_path: Path, choice: str) -> list[str]:
    (tmp_path / "allocprobe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", REEXEC_MARK)}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
    out = subprocess.run(
        [sys.executable, "-m", "allocprobe", choice], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.splitlines()


def test_a_real_rerun_keeps_the_pid_and_arguments_and_maps_tcmalloc(tmp_path):
    library = find_tcmalloc(search_dirs(os.environ))
    if library is None:
        pytest.skip("no libtcmalloc on this host (apt-get install libtcmalloc-minimal4)")
    lines = _probe(tmp_path, "auto")
    # before the re-run, then after it: one process id, the same arguments, the library loaded
    assert len(lines) == 3 and lines[0] == lines[1], lines
    assert lines[0].endswith("['auto']")
    assert lines[2] == f"mapped True {library}"
    # system: no re-run, nothing mapped
    assert _probe(tmp_path, "system")[1:] == ["mapped False "]
