"""Which config keys does the code read? A static scan of the modules a training run imports.

Used by ``test_no_lying_keys.py``. A key ``a.b.leaf`` counts as read when some expression in a runtime module (the
import closure of the entry points, outside ``async_rl/config/``) evaluates to exactly that config path: an attribute
chain starting from a name whose config path is known. Each config tree is scanned over its own entry points
(:data:`TREES`: the RL ``Config`` over train/actor/demo/launcher, the reward-model tree over its trainer). Names get a
config path from

- a type annotation naming a config struct (``cfg: Config``, ``optim: OptimConfig``, ``x: FsdpConfig | None``);
- an assignment from an expression with a known path (``r = cfg.actor_rollout_ref.rollout``, tuple unpacking too),
  including ``self.x = ...`` inside a class;
- a call to a function annotated to return a config struct (``cfg = load_config(...)``, ``cfg, _ = parse_cli()``).

Leaf names alone are never enough: ``settings.ppo_epochs`` (a learner dataclass) is not ``actor.ppo_epochs``.

A struct type used at several places of the tree (``OptimConfig`` under the actor and the critic, ``FsdpConfig``
under actor, ref and critic) makes an annotated name stand for all of them; a leaf read through it then counts for
one place only if that place's section is also reached by an exact path somewhere (``cfg.critic.optim`` passed on).

Inside the config package, :data:`RESOLVERS` fold derived and alias keys into others (``resolve_config``). There a key
counts as read when its value, or a condition on it, flows into an assignment to another key that is itself read
(``ck.dir = ck.dir or tr.default_local_dir`` makes ``trainer.default_local_dir`` read through
``async_training.checkpoint.dir``); calls to functions of the same module carry the keys their body reads.

The scan errs towards "read" in two known ways, both narrow: a shared-type reader counts for every place of that type
that is reached exactly, whether or not that place's value is what it receives; and a reader is any evaluation, so a
module that only reports a value (``tuning/``, ``tools/`` are outside the closure for that reason) would count. It
never counts a key from its leaf name alone, so removing a key's only reader makes the test fail.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import msgspec.inspect as mi

from async_rl.config import Config
from async_rl.config.introspect import Root, root_type, unwrap
from async_rl.config.pipeline import PipelineConfig
from async_rl.config.reward_model_train import RewardModelTrainConfig
from async_rl.config.sft import SFTConfig

REPO = Path(__file__).resolve().parents[2]
ENTRY_MODULES = (
    "async_rl.entrypoints.train",
    "async_rl.entrypoints.actor",
    "async_rl.entrypoints.demo",
    "launchers.local",
)
CONFIG_PACKAGE = "async_rl.config"
RESOLVERS = ("async_rl.config.resolve", "async_rl.config.correction")
RM_ENTRY_MODULES = ("async_rl.entrypoints.train_reward_model",)
SFT_ENTRY_MODULES = ("async_rl.entrypoints.sft",)
# each config tree: (the entry points that run it, the config modules that fold its keys into others)
TREES: dict[Root, tuple[tuple[str, ...], tuple[str, ...]]] = {
    Config: (ENTRY_MODULES, RESOLVERS),
    RewardModelTrainConfig: (RM_ENTRY_MODULES, ("async_rl.config.resolve",)),
    SFTConfig: (SFT_ENTRY_MODULES, ("async_rl.config.resolve",)),
    PipelineConfig: (("launchers.pipeline",), ()),
}

KeyPath = tuple[str, ...]


@dataclass(frozen=True)
class Ref:
    """A config path an expression may denote; ``via`` is the shared-type section it was reached through (or None)."""

    path: KeyPath
    via: KeyPath | None = None

    def child(self, name: str) -> Ref:
        return Ref((*self.path, name), self.via)


@dataclass
class Schema:
    leaves: set[KeyPath] = field(default_factory=set)
    sections: set[KeyPath] = field(default_factory=set)
    by_type: dict[str, list[KeyPath]] = field(default_factory=dict)  # struct class name -> its section paths

    def has(self, path: KeyPath) -> bool:
        return path in self.leaves or path in self.sections

    def refs_of_type(self, name: str) -> set[Ref]:
        paths = self.by_type.get(name, [])
        if len(paths) == 1:
            return {Ref(paths[0])}
        return {Ref(p, p) for p in paths}


@functools.lru_cache(maxsize=4)
def schema(root: Root = Config) -> Schema:
    """The key paths of ``root``'s tree; a section is found by its struct's class name and its bases' (the reward-model
    tree's ``RewardModelOptimConfig`` is read through functions annotated ``OptimConfig``)."""
    out = Schema()

    def walk(tp: mi.StructType, path: KeyPath) -> None:
        out.sections.add(path)
        for cls in tp.cls.__mro__:
            if issubclass(cls, msgspec.Struct) and cls is not msgspec.Struct:
                out.by_type.setdefault(cls.__name__, []).append(path)
        for f in tp.fields:
            inner = unwrap(f.type)[0]
            if isinstance(inner, mi.StructType):
                walk(inner, (*path, f.encode_name))
            else:
                out.leaves.add((*path, f.encode_name))

    walk(root_type(root), ())
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Modules


def module_file(name: str) -> Path | None:
    parts = name.split(".")
    for candidate in (REPO.joinpath(*parts).with_suffix(".py"), REPO.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def _imports(tree: ast.AST, package: str) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)


def import_closure(roots: Iterable[str] = ENTRY_MODULES) -> dict[str, Path]:
    """Every module of this repository a run may import from ``roots`` (function-level imports included)."""
    found: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        path = module_file(name)
        if path is None:
            continue
        found[name] = path
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        for imported in _imports(tree, package):
            parts = imported.split(".")
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return found


def runtime_modules(entries: Iterable[str] = ENTRY_MODULES) -> dict[str, Path]:
    """The import closure of the entry points, without the config package itself."""
    mods = import_closure(entries)
    return {n: p for n, p in mods.items() if n != CONFIG_PACKAGE and not n.startswith(CONFIG_PACKAGE + ".")}


# ---------------------------------------------------------------------------------------------------------------------
# Annotations


def _annotation_names(node: ast.expr | None) -> list[str]:
    """Struct-like names in an annotation (``A | None`` gives ``A``; a string annotation is parsed)."""
    if node is None:
        return []
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _annotation_names(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return []
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _annotation_names(node.left) + _annotation_names(node.right)
    if isinstance(node, ast.Subscript) and _annotation_names(node.value) == ["Optional"]:
        return _annotation_names(node.slice)
    return []


def _annotation_refs(node: ast.expr | None, root: Root) -> set[Ref]:
    refs: set[Ref] = set()
    for name in _annotation_names(node):
        refs |= schema(root).refs_of_type(name)
    return refs


def _return_refs(node: ast.expr | None, root: Root) -> list[set[Ref]] | set[Ref]:
    """What a call returns per its annotation: a set of refs, or one set per element of a ``tuple[...]``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return set()
    if isinstance(node, ast.Subscript) and _annotation_names(node.value) == ["tuple"]:
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return [_annotation_refs(e, root) for e in elts]
    return _annotation_refs(node, root)


@functools.lru_cache(maxsize=4)
def config_returning_functions(root: Root = Config) -> dict[str, list[set[Ref]] | set[Ref]]:
    """Functions of the config package annotated to return config structs (``load_config`` -> Config, ...)."""
    out: dict[str, list[set[Ref]] | set[Ref]] = {}
    for name, path in import_closure([CONFIG_PACKAGE]).items():
        if not name.startswith(CONFIG_PACKAGE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                ret = _return_refs(node.returns, root)
                if ret:
                    out[node.name] = ret
    return out


# ---------------------------------------------------------------------------------------------------------------------
# The scan


@dataclass
class Usage:
    """What a set of modules does with config paths."""

    reads: set[Ref] = field(default_factory=set)  # every config path an expression evaluated to
    flows: dict[KeyPath, set[KeyPath]] = field(default_factory=dict)  # resolvers: key read -> keys assigned from it

    def exact_sections(self) -> set[KeyPath]:
        return {r.path for r in self.reads if r.via is None}


Env = dict[str, set[Ref]]


class _Scanner:
    def __init__(self, tree: ast.Module, usage: Usage, *, track_flows: bool, root: Root) -> None:
        self.usage = usage
        self.track_flows = track_flows
        self.root, self.schema = root, schema(root)
        self.returns = dict(config_returning_functions(root))
        self.functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self._summaries: dict[str, set[KeyPath]] = {}
        for fn in self.functions.values():
            ret = _return_refs(fn.returns, root)
            if ret:
                self.returns[fn.name] = ret
        self.tree = tree

    # -- denotation ---------------------------------------------------------------------------------------------------

    def denote(self, node: ast.expr, env: Env) -> set[Ref]:
        """The config paths ``node`` may evaluate to (records nothing)."""
        if isinstance(node, ast.Name):
            return env.get(node.id, set())
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and f"self.{node.attr}" in env:
                return env[f"self.{node.attr}"]
            return {c for r in self.denote(node.value, env) if self.schema.has((c := r.child(node.attr)).path)}
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    base = self.denote(node.args[0], env)
                    return {c for r in base if self.schema.has((c := r.child(name.value)).path)}
            ret = self.returns.get(_callee(node))
            return ret if isinstance(ret, set) else set()
        if isinstance(node, ast.IfExp):
            return self.denote(node.body, env) | self.denote(node.orelse, env)
        if isinstance(node, ast.BoolOp):
            return set().union(*(self.denote(v, env) for v in node.values))
        if isinstance(node, ast.Await | ast.NamedExpr):
            return self.denote(node.value, env)
        return set()

    def leaf_reads(self, node: ast.AST, env: Env, local_reads: dict[str, set[KeyPath]]) -> set[KeyPath]:
        """Config leaves whose values ``node`` depends on (through locals and same-module calls too)."""
        out: set[KeyPath] = set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                out |= local_reads.get(sub.id, set())
            elif isinstance(sub, ast.Attribute | ast.Call):
                if isinstance(sub, ast.Call) and _callee(sub) in self.functions:
                    out |= self.summary(_callee(sub))
                out |= {r.path for r in self.denote(sub, env) if r.path in self.schema.leaves}
        return out

    def summary(self, name: str) -> set[KeyPath]:
        if name not in self._summaries:
            self._summaries[name] = set()  # recursion guard
            fn = self.functions[name]
            env = self.function_env(fn, {})
            self._summaries[name] = self.leaf_reads(fn, env, {})
        return self._summaries[name]

    # -- environments -------------------------------------------------------------------------------------------------

    def bind(self, target: ast.expr, value: ast.expr | None, refs: set[Ref] | None, env: Env) -> None:
        if refs is None:
            refs = self.denote(value, env) if value is not None else set()
        if isinstance(target, ast.Name):
            if refs:
                env[target.id] = refs
            else:
                env.pop(target.id, None)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            if refs:
                env[f"self.{target.attr}"] = refs
        elif isinstance(target, ast.Tuple | ast.List):
            parts: list[set[Ref]] | None = None
            if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(target.elts):
                parts = [self.denote(v, env) for v in value.elts]
            elif isinstance(value, ast.Call):
                ret = self.returns.get(_callee(value))
                if isinstance(ret, list) and len(ret) == len(target.elts):
                    parts = ret
            for i, t in enumerate(target.elts):
                self.bind(t, None, parts[i] if parts else set(), env)

    def bind_loop(self, target: ast.expr, iterable: ast.expr, env: Env) -> None:
        """``for sec in (a, b)`` makes ``sec`` stand for both; ``for k, sec in ((.., a), (.., b))`` likewise."""
        items = iterable.elts if isinstance(iterable, ast.Tuple | ast.List) else None
        if items is None:
            self.bind(target, None, set(), env)
        elif isinstance(target, ast.Tuple | ast.List):
            width = len(target.elts)
            rows = [e.elts for e in items if isinstance(e, ast.Tuple | ast.List) and len(e.elts) == width]
            for i, t in enumerate(target.elts):
                refs = set().union(*(self.denote(row[i], env) for row in rows)) if len(rows) == len(items) else set()
                self.bind(t, None, refs, env)
        else:
            self.bind(target, None, set().union(*(self.denote(e, env) for e in items)), env)

    def function_env(self, fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, outer: Env) -> Env:
        env = dict(outer)
        args = fn.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            env.pop(a.arg, None)
            refs = _annotation_refs(a.annotation, self.root)
            if refs:
                env[a.arg] = refs
        return env

    # -- walking ------------------------------------------------------------------------------------------------------

    def scan_module(self) -> None:
        env: Env = {}
        for cls in [n for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)]:
            self._collect_self(cls, env)
        self.block(self.tree.body, env, {}, [])

    def _collect_self(self, cls: ast.ClassDef, env: Env) -> None:
        """``self.x = <config path>`` anywhere in a class makes ``self.x`` that path in all its methods."""
        for method in cls.body:
            if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
                menv = self.function_env(method, {})
                for stmt in ast.walk(method):
                    if isinstance(stmt, ast.Assign):
                        for t in stmt.targets:
                            self.bind(t, stmt.value, None, menv)
                env.update({k: v for k, v in menv.items() if k.startswith("self.")})

    def record(self, node: ast.AST, env: Env) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute | ast.Call):
                self.usage.reads |= self.denote(sub, env)

    def block(
        self, body: list[ast.stmt], env: Env, local_reads: dict[str, set[KeyPath]], control: list[ast.expr]
    ) -> None:
        for stmt in body:
            self.statement(stmt, env, local_reads, control)

    def statement(
        self, stmt: ast.stmt, env: Env, local_reads: dict[str, set[KeyPath]], control: list[ast.expr]
    ) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in stmt.decorator_list:
                self.record(deco, env)
            self.block(stmt.body, self.function_env(stmt, env), {}, [])
            return
        if isinstance(stmt, ast.ClassDef):
            self.block(stmt.body, env, {}, [])
            return
        if isinstance(stmt, ast.If | ast.While):
            self.record(stmt.test, env)
            self.block(stmt.body, env, local_reads, [*control, stmt.test])
            self.block(stmt.orelse, env, local_reads, [*control, stmt.test])
            return
        if isinstance(stmt, ast.For | ast.AsyncFor):
            self.record(stmt.iter, env)
            self.bind_loop(stmt.target, stmt.iter, env)
            self.block(stmt.body, env, local_reads, [*control, stmt.iter])
            self.block(stmt.orelse, env, local_reads, control)
            return
        if isinstance(stmt, ast.With | ast.AsyncWith):
            for item in stmt.items:
                self.record(item.context_expr, env)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, item.context_expr, None, env)
            self.block(stmt.body, env, local_reads, control)
            return
        if isinstance(stmt, ast.Try):
            for part in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                self.block(part, env, local_reads, control)
            return
        # Simple statements: record what they read, then bind names.
        self.record(stmt, env)
        value = getattr(stmt, "value", None)
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = list(stmt.targets)
        elif isinstance(stmt, ast.AnnAssign):
            targets = [stmt.target]
            refs = _annotation_refs(stmt.annotation, self.root)
            if refs:
                self.bind(stmt.target, None, refs, env)
                return
        elif isinstance(stmt, ast.AugAssign):
            targets = [stmt.target]
        if not targets:
            return
        if self.track_flows:
            sources = self.leaf_reads(value, env, local_reads) if value is not None else set()
            for cond in control:
                sources |= self.leaf_reads(cond, env, local_reads)
            for t in targets:
                for name in _target_names(t):
                    local_reads[name] = local_reads.get(name, set()) | sources
                for ref in self.denote(t, env) if isinstance(t, ast.Attribute) else set():
                    if ref.path in self.schema.leaves:
                        for s in sources - {ref.path}:
                            self.usage.flows.setdefault(s, set()).add(ref.path)
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            for t in targets:
                self.bind(t, value, None, env)


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [n for t in target.elts for n in _target_names(t)]
    return []


def scan_sources(sources: Iterable[str], *, track_flows: bool = False, root: Root = Config) -> Usage:
    """What ``sources`` read of ``root``'s tree."""
    usage = Usage()
    for text in sources:
        _Scanner(ast.parse(text), usage, track_flows=track_flows, root=root).scan_module()
    return usage


def consumed_keys(runtime: Usage, resolvers: Usage | None = None, *, root: Root = Config) -> set[str]:
    """Dotted leaf keys of ``root``'s tree read by ``runtime`` (shared-type reads need their section reached exactly),
    plus keys that ``resolvers`` fold into keys so consumed."""
    exact = runtime.exact_sections()
    leaves = schema(root).leaves
    done = {r.path for r in runtime.reads if r.path in leaves and (r.via is None or r.via in exact)}
    if resolvers is not None:
        changed = True
        while changed:
            changed = False
            for src, targets in resolvers.flows.items():
                if src not in done and targets & done:
                    done.add(src)
                    changed = True
    return {".".join(p) for p in done}


def scan_repository(root: Root = Config) -> set[str]:
    """The dotted keys of ``root``'s tree that a run of its entry points reads (see the module docstring)."""
    entries, resolver_names = TREES[root]
    runtime = scan_sources((p.read_text() for p in runtime_modules(entries).values()), root=root)
    resolver_files = [module_file(name) for name in resolver_names]
    resolvers = scan_sources((p.read_text() for p in resolver_files if p is not None), track_flows=True, root=root)
    return consumed_keys(runtime, resolvers, root=root)


__all__ = ["consumed_keys", "import_closure", "runtime_modules", "scan_repository", "scan_sources", "schema"]
