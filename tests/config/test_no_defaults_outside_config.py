"""No defaults outside the config: a function parameter named after a config leaf (``seed``, ``clip_ratio``,
``keep_last``, ...) takes its value from the caller, who reads it from the config, so a signature can never shadow the
config's default with one of its own (``verify_rotation=1`` against the config's 4 was such a case).

``KNOWN`` lists the defaults that are left, as (module under async_rl/, function, parameter). The test fails on a
default that is not in it, and on an entry that no longer exists, so the list only shrinks. Some entries are generic
names that happen to be config leaves (``timeout_s`` of a poll); the rest are work left (issue: "no defaults outside
the config").
"""

from __future__ import annotations

import ast
from pathlib import Path

from _config_key_usage import REPO, schema

PACKAGE = REPO / "async_rl"

KNOWN: set[tuple[str, str, str]] = {
    ("actor/emulated.py", "announce", "timeout_s"),
    ("actor/loop.py", "announce", "timeout_s"),
    ("actor/loop.py", "poll", "timeout_s"),
    ("actor/loop.py", "request_work", "timeout_s"),
    ("learner/dist.py", "local_context", "device"),
    ("rewards/worker.py", "__init__", "timeout_s"),
    ("runtime/validation.py", "wait_eval", "timeout_s"),
    ("transport/client.py", "flush", "timeout_s"),
    ("transport/client.py", "hello", "timeout_s"),
    ("transport/client.py", "poll", "timeout_s"),
    ("transport/client.py", "request_work", "timeout_s"),
    ("transport/coordinator.py", "get_groups", "timeout_s"),
    ("transport/coordinator.py", "wait_eval", "timeout_s"),
    ("tuning/probes.py", "_await", "timeout_s"),
    ("tuning/sweep.py", "execute_run", "timeout_s"),
    ("tuning/validate.py", "run_case", "timeout_s"),
    ("weight_sync/client.py", "announce", "timeout_s"),
    ("weight_sync/membership.py", "announce_at", "timeout_s"),
}


def config_leaf_names() -> set[str]:
    return {path[-1] for path in schema().leaves}


def defaults_on_config_names(package: Path = PACKAGE) -> set[tuple[str, str, str]]:
    """(module path under ``package``, function, parameter) of every parameter with a default whose name is a config
    leaf, outside ``package/config``."""
    leaves = config_leaf_names()
    found: set[tuple[str, str, str]] = set()
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.startswith("config/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            with_defaults = positional[len(positional) - len(args.defaults) :]
            with_defaults += [a for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            found.update((rel, node.name, a.arg) for a in with_defaults if a.arg in leaves)
    return found


def test_no_new_default_on_a_config_named_parameter() -> None:
    new = defaults_on_config_names() - KNOWN
    assert not new, (
        "parameters named after a config leaf take no default (the caller passes the config's value): "
        + ", ".join(f"{m}::{f}({p}=...)" for m, f, p in sorted(new))
    )


def test_the_known_list_only_shrinks() -> None:
    gone = KNOWN - defaults_on_config_names()
    assert not gone, f"fixed, so remove from KNOWN: {sorted(gone)}"


def test_the_scan_finds_a_default(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "config").mkdir(parents=True)
    (pkg / "config" / "x.py").write_text("def f(seed=1): ...\n")  # the config package may default its own values
    (pkg / "a.py").write_text("def g(x, seed=0, *, keep_last=3, other=2, clip_ratio): ...\n")
    assert defaults_on_config_names(pkg) == {("a.py", "g", "seed"), ("a.py", "g", "keep_last")}
