"""The package's layering, stated as data and checked on the import graph of the source (``if TYPE_CHECKING:`` blocks
do not count: they run only under the type checker).

A rule names a package and what its import closure (everything it imports, directly or through other modules of this
repository) must not reach. So a module that is allowed to import ``config`` cannot smuggle ``config`` into
``algorithms``, and a rule is broken by a helper's import as much as by a direct one. Two kinds of rule:

* ``RULES``, between this repository's packages: every import counts, function-level ones included (a lazy import is
  still a dependency);
* ``IMPORT_TIME_RULES``, on heavy third-party packages: only what importing the package runs counts (a function may
  import torch when it is called; importing the config must not).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "config"))
from _config_key_usage import REPO, module_file  # noqa: E402

ROLES = ("async_rl.actor", "async_rl.learner", "async_rl.runtime", "async_rl.entrypoints")

# package -> what its closure must not contain (prefixes of module names; third-party names are top-level packages)
RULES: dict[str, tuple[str, ...]] = {
    # pure tensor math: no config parsing, no processes, no transport
    "async_rl.algorithms": ("async_rl.config", "async_rl.transport", "async_rl.weight_sync", *ROLES),
    # the two roles meet only through the wire structs (transport) and the weight sync
    "async_rl.actor": ("async_rl.learner",),
    "async_rl.learner": ("async_rl.actor",),
    # the weight sync carries tensors between roles and knows neither
    "async_rl.weight_sync": ROLES,
    # the config is read by every process and by tools; it knows no role
    "async_rl.config": ("async_rl.transport", "async_rl.weight_sync", *ROLES),
    # the adapter format is a leaf every role reads
    "async_rl.peft_format": ("async_rl.config", "async_rl.transport", "async_rl.weight_sync", *ROLES),
}

# package -> third-party packages that importing it must not load
IMPORT_TIME_RULES: dict[str, tuple[str, ...]] = {
    "async_rl.config": ("torch", "vllm", "transformers"),
    "async_rl.peft_format": ("torch", "safetensors"),
    "async_rl.transport": ("torch", "vllm"),
}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _runtime_nodes(node: ast.AST, *, import_time: bool) -> Iterator[ast.AST]:
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:`` (their ``else`` runs) and, with
    ``import_time``, of functions (their decorators and defaults run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other, import_time=import_time)
            continue
        if import_time and isinstance(child, _FUNCTIONS):
            kept = [*getattr(child, "decorator_list", []), *child.args.defaults, *child.args.kw_defaults]
            for other in kept:
                if other is not None:
                    yield other
                    yield from _runtime_nodes(other, import_time=import_time)
            continue
        yield child
        yield from _runtime_nodes(child, import_time=import_time)


def imports_of(name: str, path: Path, *, import_time: bool) -> set[str]:
    """Absolute names this module imports at run time, or only while it is imported with ``import_time``
    (``from a import b`` gives ``a`` and ``a.b``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path)), import_time=import_time):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def package_modules(package: str) -> list[str]:
    path = module_file(package)
    assert path is not None, package
    if path.name != "__init__.py":
        return [package]
    return sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for p in path.parent.rglob("*.py")
    )


def closure_with_paths(package: str, *, import_time: bool) -> dict[str, list[str]]:
    """Every name reachable from the package's modules, with one import chain that reaches it."""
    chains: dict[str, list[str]] = {}
    todo = [(m, [m]) for m in package_modules(package)]
    while todo:
        name, chain = todo.pop()
        if name in chains:
            continue
        chains[name] = chain
        path = module_file(name)
        if path is None:  # third-party, the standard library, or an attribute of a module
            continue
        for imported in imports_of(name, path, import_time=import_time):
            parts = imported.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix not in chains:
                    todo.append((prefix, [*chain, prefix]))
    return chains


def violations(package: str, forbidden: tuple[str, ...], *, import_time: bool = False) -> list[str]:
    """One import chain per forbidden package, or module inside one, that the package reaches."""
    return [
        " -> ".join(chain)
        for name, chain in sorted(closure_with_paths(package, import_time=import_time).items())
        if name in forbidden or (module_file(name) is not None and any(name.startswith(f + ".") for f in forbidden))
    ]


@pytest.mark.parametrize("package", sorted(RULES))
def test_layering(package: str) -> None:
    bad = violations(package, RULES[package])
    assert not bad, f"{package} must not import {RULES[package]}; found:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", sorted(IMPORT_TIME_RULES))
def test_import_time_layering(package: str) -> None:
    bad = violations(package, IMPORT_TIME_RULES[package], import_time=True)
    assert not bad, f"importing {package} must not load {IMPORT_TIME_RULES[package]}; found:\n" + "\n".join(bad)


def test_the_rules_catch_a_violation(tmp_path, monkeypatch) -> None:
    """The checker itself: an import through a helper of another package is reported with its chain; a lazy import
    counts for the package rules and not at import time; TYPE_CHECKING imports never count."""
    for pkg in ("probe_pure", "probe_heavy"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "probe_pure" / "math_part.py").write_text("def f():\n    from probe_heavy import helper\n")
    helper = "import torch\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import vllm\n"
    (tmp_path / "probe_heavy" / "helper.py").write_text(helper)
    import _config_key_usage

    monkeypatch.setattr(_config_key_usage, "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert violations("probe_pure", ("torch",)) == ["probe_pure.math_part -> probe_heavy.helper -> torch"]
    assert violations("probe_pure", ("probe_heavy",)) == [
        "probe_pure.math_part -> probe_heavy",
        "probe_pure.math_part -> probe_heavy.helper",
    ]
    assert violations("probe_pure", ("vllm",)) == []
    assert violations("probe_pure", ("torch",), import_time=True) == []  # only a function imports the helper
    (tmp_path / "probe_pure" / "eager.py").write_text("import probe_heavy.helper\n")
    assert violations("probe_pure", ("torch",), import_time=True) == ["probe_pure.eager -> probe_heavy.helper -> torch"]
