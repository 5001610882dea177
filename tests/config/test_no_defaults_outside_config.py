"""No defaults outside the config: a function parameter named after a config leaf (``seed``, ``clip_ratio``,
``keep_last``, ...) takes its value from the caller, who reads it from the config, so a signature can never shadow the
config's default with one of its own (``verify_rotation=1`` against the config's 4 was such a case, and so was the
weight-sync announcement's ``timeout_s=30`` against ``async_training.weight_sync.timeout_s``). Such parameters are
keyword-only with no default; tests pass explicit values.

Two lists allow a default, as (module under async_rl/, function, parameter). ``GENERIC`` holds parameters whose name
merely coincides with a config leaf while no config value ever flows into them (a poll's ``timeout_s``), each with the
reason. ``KNOWN`` is for defaults that should go and have not yet (issue: "no defaults outside the config"); it is
empty, and meant to stay so. The test fails on a default in neither list, and on an entry of either that no longer
exists, so both lists only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

from _config_key_usage import REPO, schema

PACKAGE = REPO / "async_rl"

KNOWN: set[tuple[str, str, str]] = set()

GENERIC: dict[tuple[str, str, str], str] = {
    ("actor/loop.py", "poll", "timeout_s"): "PlaneClient protocol: RolloutClient.poll's wait for a message",
    ("actor/loop.py", "request_work", "timeout_s"): "PlaneClient protocol: RolloutClient.request_work's wait",
    ("learner/dist.py", "local_context", "device"): (
        "a one-process context's torch device (None: pick_device); trainer.device only pins GPUs in the launcher"
    ),
    ("transport/client.py", "flush", "timeout_s"): "how long to poll until the socket took the queued groups",
    ("transport/client.py", "hello", "timeout_s"): (
        "the wait for the Welcome of a plane already up; actor_main passes timeouts.actor_start_s for the first one"
    ),
    ("transport/client.py", "poll", "timeout_s"): "a zmq poll's wait for one message (0: do not block)",
    ("transport/client.py", "request_work", "timeout_s"): "how long to wait for grants after offering credit",
    ("tuning/validate.py", "run_case", "timeout_s"): "wall-clock cap of one validation run of the launcher",
}


def config_leaf_names() -> set[str]:
    """The leaf names of every config tree: RL training's, reward-model training's and SFT's."""
    from async_rl.config.introspect import leaf_keys
    from async_rl.config.reward_model_train import RewardModelTrainConfig
    from async_rl.config.sft import SFTConfig

    others = {k.rsplit(".", 1)[-1] for root in (RewardModelTrainConfig, SFTConfig) for k in leaf_keys(root)}
    return {path[-1] for path in schema().leaves} | others


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
    new = defaults_on_config_names() - KNOWN - GENERIC.keys()
    assert not new, (
        "parameters named after a config leaf take no default (the caller passes the config's value): "
        + ", ".join(f"{m}::{f}({p}=...)" for m, f, p in sorted(new))
    )


def test_the_known_list_only_shrinks() -> None:
    gone = KNOWN - defaults_on_config_names()
    assert not gone, f"fixed, so remove from KNOWN: {sorted(gone)}"


def test_the_generic_list_only_shrinks() -> None:
    gone = GENERIC.keys() - defaults_on_config_names()
    assert not gone, f"no longer a default, so remove from GENERIC: {sorted(gone)}"


def test_the_lists_are_disjoint_and_every_generic_entry_says_why() -> None:
    assert not KNOWN & GENERIC.keys()
    assert all(reason.strip() for reason in GENERIC.values())


def test_the_scan_finds_a_default(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "config").mkdir(parents=True)
    (pkg / "config" / "x.py").write_text("def f(seed=1): ...\n")  # the config package may default its own values
    (pkg / "a.py").write_text("def g(x, seed=0, *, keep_last=3, other=2, clip_ratio): ...\n")
    assert defaults_on_config_names(pkg) == {("a.py", "g", "seed"), ("a.py", "g", "keep_last")}
