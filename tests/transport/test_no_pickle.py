"""No pickle anywhere: an AST scan of every .py file under async_rl/, tools/ and launchers/.

Flags imports of pickle-family modules, pyzmq's recv_pyobj/send_pyobj, torch.load without weights_only=True,
numpy.load with allow_pickle=True, pandas' read_pickle, and dynamic imports of pickle-family modules; failures name
file:line. The scanner is tested on snippets first, so that a broken scanner cannot pass silently.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCANNED_DIRS = ("async_rl", "tools", "launchers")
PICKLE_MODULES = frozenset({"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "shelve"})
PYOBJ_NAMES = frozenset({"recv_pyobj", "send_pyobj", "read_pickle", "to_pickle"})


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.problems: list[tuple[int, str]] = []
        self.torch_names: set[str] = set()  # names bound to the torch module
        self.torch_load_names: set[str] = set()  # names bound to torch.load
        self.numpy_names: set[str] = set()

    def _flag(self, node: ast.AST, what: str) -> None:
        self.problems.append((getattr(node, "lineno", 0), what))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top in PICKLE_MODULES:
                self._flag(node, f"import {alias.name}")
            if alias.name == "torch":
                self.torch_names.add(alias.asname or "torch")
            if alias.name == "numpy":
                self.numpy_names.add(alias.asname or "numpy")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.split(".")[0] in PICKLE_MODULES:
            self._flag(node, f"from {module} import ...")
        for alias in node.names:
            if alias.name in PICKLE_MODULES:
                self._flag(node, f"from {module} import {alias.name}")
            if alias.name in PYOBJ_NAMES:
                self._flag(node, f"from {module} import {alias.name}")
            if module == "torch" and alias.name == "load":
                self.torch_load_names.add(alias.asname or "load")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in PYOBJ_NAMES:
            self._flag(node, f".{node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        is_torch_load = (
            isinstance(func, ast.Attribute)
            and func.attr == "load"
            and isinstance(func.value, ast.Name)
            and func.value.id in self.torch_names
        ) or (isinstance(func, ast.Name) and func.id in self.torch_load_names)
        if is_torch_load:
            weights_only = _keyword(node, "weights_only")
            if weights_only is None or not _is_true(weights_only):
                self._flag(node, "torch.load without weights_only=True")
        is_numpy_load = (
            isinstance(func, ast.Attribute)
            and func.attr == "load"
            and isinstance(func.value, ast.Name)
            and func.value.id in self.numpy_names
        )
        allow = _keyword(node, "allow_pickle")
        if is_numpy_load and allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
            self._flag(node, "numpy.load with allow_pickle")
        dynamic = (isinstance(func, ast.Name) and func.id == "__import__") or (
            isinstance(func, ast.Attribute) and func.attr == "import_module"
        )
        if dynamic and node.args and isinstance(node.args[0], ast.Constant):
            target = str(node.args[0].value)
            if target.split(".")[0] in PICKLE_MODULES:
                self._flag(node, f"dynamic import of {target}")
        self.generic_visit(node)


def scan_source(source: str, filename: str = "<snippet>") -> list[tuple[int, str]]:
    scanner = _Scanner()
    scanner.visit(ast.parse(source, filename=filename))
    return scanner.problems


def test_scanner_catches_every_pattern() -> None:
    bad = {
        "import pickle": "import pickle",
        "import cloudpickle as cp": "import cloudpickle",
        "from dill import dumps": "from dill",
        "import pickle.foo": "import pickle.foo",
        "sock.recv_pyobj()": ".recv_pyobj",
        "sock.send_pyobj(x)": ".send_pyobj",
        "import torch\ntorch.load(f)": "weights_only",
        "import torch as th\nth.load(f, weights_only=False)": "weights_only",
        "from torch import load as tl\ntl(f)": "weights_only",
        "import numpy as np\nnp.load(f, allow_pickle=True)": "allow_pickle",
        "importlib.import_module('pickle')": "dynamic import",
        "__import__('dill')": "dynamic import",
        "import pandas as pd\npd.read_pickle(p)": ".read_pickle",
    }
    for source, expected in bad.items():
        problems = scan_source(source)
        assert problems and any(expected in what for _, what in problems), f"missed: {source!r} -> {problems}"
    fine = [
        "import torch\ntorch.load(f, weights_only=True, map_location='cpu')",
        "import numpy as np\nnp.load(f)",
        "import msgspec\nmsgspec.msgpack.decode(b)",
        "pickled = 1  # the word alone is fine",
    ]
    for source in fine:
        assert scan_source(source) == [], source


def test_no_pickle_in_the_code_base() -> None:
    problems: list[str] = []
    scanned = 0
    for top in SCANNED_DIRS:
        root = REPO_ROOT / top
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            scanned += 1
            rel = path.relative_to(REPO_ROOT)
            for line, what in scan_source(path.read_text(encoding="utf-8"), str(rel)):
                problems.append(f"{rel}:{line}: {what}")
    assert scanned > 0, "no Python files found: is REPO_ROOT right?"
    assert not problems, "pickle-family serialization found:\n" + "\n".join(problems)
