"""Metric keys are written once, in async_rl/metric_catalog.py: no string literal or f-string elsewhere in the package
or the tools starts with a metric namespace (``learner/``, ``transport/``, ...). Producers and readers import the
catalog's constants and builders instead, so a key cannot drift between the code that logs it and the code that
reads it."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("async_rl", "tools")
CATALOG = "async_rl/metric_catalog.py"
NAMESPACES = ("learner/", "transport/", "sync/", "actor/", "rollout/", "val/", "val-core/", "time/", "reward/", "rm/")
# (file, the literal's text up to its first placeholder) -> why it is not a key of this system
ALLOWED = {
    ("tools/verl_crosscheck.py", "actor/"): "verl's own metric names (verl's actor/pg_clipfrac), read from verl",
}


def _leading_text(node: ast.JoinedStr) -> str:
    """An f-string's text before its first placeholder ("" when it starts with one)."""
    first = node.values[0] if node.values else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""


def namespace_literals(root: Path, dirs: tuple[str, ...] = ROOTS) -> list[tuple[str, int, str]]:
    """``(file, line, text)`` of each string literal or f-string under ``root/dirs`` (the catalog excepted) that starts
    with a metric namespace; an f-string counts once, by its text before its first placeholder."""
    found = []
    for top in dirs:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == CATALOG:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            inside_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
            for node in ast.walk(tree):
                if isinstance(node, ast.JoinedStr):
                    text = _leading_text(node)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_fstrings:
                    text = node.value
                else:
                    continue
                if text.startswith(NAMESPACES):
                    found.append((rel, node.lineno, text))
    return sorted(found)


def test_no_metric_key_is_written_outside_the_catalog() -> None:
    found = namespace_literals(REPO)
    offending = [f"{f}:{line}: {text!r}" for f, line, text in found if (f, text) not in ALLOWED]
    assert offending == [], (
        "metric keys written outside async_rl/metric_catalog.py; use its constants and builders "
        "(or, for a string that is not a key of this system, add it to ALLOWED with the reason):\n"
        + "\n".join(offending)
    )
    used = {(f, text) for f, _, text in found}
    assert [entry for entry in ALLOWED if entry not in used] == [], "ALLOWED lists a literal that is gone"


def test_the_scan_finds_literals_and_fstrings_but_not_the_catalog(tmp_path: Path) -> None:
    pkg = tmp_path / "async_rl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "metric_catalog.py").write_text('KEY = "learner/actor/pg_loss"\n')
    (pkg / "sub" / "producer.py").write_text(
        "def metrics(reason, name, prefix):\n"
        '    out = {"rollout/reward_mean": 1.0}\n'  # a literal
        '    out[f"rollout/finish/{reason}"] = 0.5\n'  # an f-string
        '    out[f"transport/{name}_total"] = 2\n'
        '    out[f"{prefix}/x"] = 3  # starts with a placeholder: not seen\n'
        '    out["sub/rollout/x"] = 4  # not a namespace at the start\n'
        '    out["learner"] = 5  # no "/"\n'
        "    return out\n"
    )
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "bench.py").write_text('WALL = "time/wall_s"\n')
    assert namespace_literals(tmp_path) == [
        ("async_rl/sub/producer.py", 2, "rollout/reward_mean"),
        ("async_rl/sub/producer.py", 3, "rollout/finish/"),
        ("async_rl/sub/producer.py", 4, "transport/"),
        ("tools/bench.py", 1, "time/wall_s"),
    ]
