"""Walk the config schema: dotted keys, types, defaults, descriptions, unknown-key detection and value diffs.

Everything here works from ``msgspec.inspect.type_info(Config)``, so ``--help``, "did you mean" suggestions, error
messages (allowed values of a key) and the "set but has no effect" warnings never drift from the struct definitions.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi

from async_rl.config.fields import NOOP_MARK
from async_rl.config.schema import Config


class KeyDoc(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of the schema walk: a section (struct) or a leaf key."""

    key: str
    type: str
    default: Any
    description: str
    noop: bool
    is_section: bool


Root = type[msgspec.Struct]
"""The root struct of a config tree: :class:`Config` (RL training) or another entry point's (reward-model training)."""


@functools.lru_cache(maxsize=8)
def root_type(root: Root = Config) -> mi.StructType:
    """The inspected type of a config tree's root struct (cached)."""
    info = mi.type_info(root)
    assert isinstance(info, mi.StructType)
    return info


def unwrap(tp: mi.Type) -> tuple[mi.Type, str, bool]:
    """Strip ``Metadata`` layers: (inner type, description, is-noop)."""
    description, is_noop = "", False
    while isinstance(tp, mi.Metadata):
        if tp.extra_json_schema and "description" in tp.extra_json_schema:
            description = str(tp.extra_json_schema["description"])
        if tp.extra and tp.extra.get(NOOP_MARK):
            is_noop = True
        tp = tp.type
    return tp, description, is_noop


def _bounds(tp: mi.IntType | mi.FloatType) -> str:
    parts = [f"{op} {v}" for op, v in ((">", tp.gt), (">=", tp.ge), ("<", tp.lt), ("<=", tp.le)) if v is not None]
    return (" " + " and ".join(parts)) if parts else ""


def type_name(tp: mi.Type) -> str:
    """Human-readable type of a schema node, e.g. ``int >= 1 | null`` or ``'token' | 'sequence'``."""
    tp, _, _ = unwrap(tp)
    if isinstance(tp, mi.IntType):
        return "int" + _bounds(tp)
    if isinstance(tp, mi.FloatType):
        return "float" + _bounds(tp)
    if isinstance(tp, mi.LiteralType):
        return " | ".join(repr(v) for v in tp.values)
    if isinstance(tp, mi.ListType):
        return f"list[{type_name(tp.item_type)}]"
    if isinstance(tp, mi.TupleType):
        return "[" + ", ".join(type_name(t) for t in tp.item_types) + "]"
    if isinstance(tp, mi.UnionType):
        return " | ".join(type_name(t) for t in tp.types)
    if isinstance(tp, mi.StructType):
        return "section"
    if isinstance(tp, mi.StrType) and tp.min_length:
        return "non-empty str"
    simple = {mi.StrType: "str", mi.BoolType: "bool", mi.NoneType: "null", mi.DictType: "mapping", mi.AnyType: "any"}
    return simple.get(type(tp), type(tp).__name__)


def allowed_values(tp: mi.Type) -> tuple[Any, ...] | None:
    """The literal values a node accepts (looking through unions and lists), or None if it is not an enum."""
    tp, _, _ = unwrap(tp)
    if isinstance(tp, mi.LiteralType):
        return tp.values
    if isinstance(tp, mi.ListType):
        return allowed_values(tp.item_type)
    if isinstance(tp, mi.UnionType):
        for member in tp.types:
            found = allowed_values(member)
            if found is not None:
                return found
    return None


def _fields(tp: mi.StructType) -> dict[str, mi.Field]:
    return {f.encode_name: f for f in tp.fields}


def type_at(parts: list[str | int], root: Root = Config) -> mi.Type | None:
    """Schema node at a path of field names / list indices (None when the path leaves the schema)."""
    node: mi.Type = root_type(root)
    for part in parts:
        node, _, _ = unwrap(node)
        if isinstance(node, mi.UnionType):  # pick the member that can be indexed the way the path goes
            want = mi.ListType if isinstance(part, int) else mi.StructType
            node = next((m for m in (unwrap(t)[0] for t in node.types) if isinstance(m, want)), node)
        if isinstance(part, int) and isinstance(node, mi.ListType):
            node = node.item_type
        elif isinstance(part, str) and isinstance(node, mi.StructType) and part in _fields(node):
            node = _fields(node)[part].type
        else:
            return None
    return node


def iter_schema(
    tp: mi.StructType | None = None,
    default: Any = None,
    prefix: str = "",
    inherited_noop: bool = False,
    root: Root = Config,
) -> Iterator[KeyDoc]:
    """Depth-first walk of the schema (of ``root``'s tree) yielding sections and leaf keys with their defaults."""
    if tp is None:
        tp, default = root_type(root), root()
    for field in tp.fields:
        inner, description, is_noop = unwrap(field.type)
        is_noop = is_noop or inherited_noop
        key = f"{prefix}{field.encode_name}"
        value = getattr(default, field.name)
        if isinstance(inner, mi.StructType):
            yield KeyDoc(key=key, type="section", default=None, description=description, noop=is_noop, is_section=True)
            yield from iter_schema(inner, value, key + ".", is_noop)
        else:
            plain = msgspec.to_builtins(value)
            yield KeyDoc(
                key=key, type=type_name(inner), default=plain, description=description, noop=is_noop, is_section=False
            )


@functools.lru_cache(maxsize=8)
def leaf_keys(root: Root = Config) -> tuple[str, ...]:
    """Every dotted leaf key of the schema."""
    return tuple(d.key for d in iter_schema(root=root) if not d.is_section)


def suggest(key: str, siblings: list[str], root: Root = Config) -> list[str]:
    """Suggestions for an unknown dotted ``key``: keys elsewhere with that exact leaf name, else a close sibling name,
    else keys elsewhere with a close leaf name."""
    head, _, leaf = key.rpartition(".")
    same_leaf = [k for k in leaf_keys(root) if k.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return same_leaf[:3]
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    if close:
        return [f"{head}.{close[0]}" if head else close[0]]
    by_leaf: dict[str, list[str]] = {}
    for k in leaf_keys(root):
        by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
    return by_leaf[close[0]][:3] if close else []


def unknown_keys(
    raw: dict[str, Any], tp: mi.StructType | None = None, prefix: str = "", root: Root = Config
) -> list[str]:
    """Messages for every key of ``raw`` that the schema does not have (with "did you mean" suggestions)."""
    tp = tp or root_type(root)
    fields = _fields(tp)
    problems: list[str] = []
    for name, value in raw.items():
        key = f"{prefix}{name}"
        if not isinstance(name, str) or name not in fields:
            hint = suggest(str(key), list(fields), root)
            where = f"section `{prefix[:-1]}`" if prefix else "the top level"
            msg = f"unknown config key `{key}` (not in {where})"
            problems.append(msg + (f"; did you mean {' or '.join(f'`{h}`' for h in hint)}?" if hint else ""))
            continue
        inner, _, _ = unwrap(fields[name].type)
        if isinstance(inner, mi.StructType) and isinstance(value, dict):
            problems.extend(unknown_keys(value, inner, key + ".", root))
    return problems


def _accepts_only_str(tp: mi.Type) -> bool:
    members = tp.types if isinstance(tp, mi.UnionType) else (tp,)
    kinds = {type(unwrap(m)[0]) for m in members}
    return mi.StrType in kinds and not kinds & {mi.IntType, mi.FloatType, mi.LiteralType}


def coerce(value: Any, tp: mi.Type | None = None, root: Root = Config) -> Any:
    """Type-guided leniency before conversion: numbers given for string keys become strings (``experiment_name=7``),
    a bare string given for a list key becomes a one-element list (``trainer.logger=console``) and an empty (null)
    section becomes an empty mapping."""
    tp = unwrap(tp or root_type(root))[0]
    if isinstance(tp, mi.StructType) and value is None:
        value = {}  # an empty YAML section (all of its lines commented out) parses as null
    if isinstance(tp, mi.StructType) and isinstance(value, dict):
        fields = _fields(tp)
        return {k: coerce(v, fields[k].type) if k in fields else v for k, v in value.items()}
    if isinstance(tp, mi.ListType):
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            return [coerce(v, tp.item_type) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool) and _accepts_only_str(tp):
        return str(value)
    return value


def _class_default(field: mi.Field) -> Any:
    if field.default_factory is not mi.NODEFAULT:
        return field.default_factory()
    return field.default


def with_section_defaults(raw: dict[str, Any], default: msgspec.Struct) -> dict[str, Any]:
    """``raw`` with every section it gives only in part completed from ``default`` (the tree's default instance).

    msgspec fills a missing key from its struct class's default; a section whose place in the tree has other defaults
    (``critic.optim``: lr 1e-5 where ``OptimConfig`` says 1e-6) would lose them as soon as one of its keys is given.
    This puts those keys in first: only the leaves whose default at that place differs from the class default."""
    tp = mi.type_info(type(default))
    assert isinstance(tp, mi.StructType)
    out = dict(raw)
    for field in tp.fields:
        inner = unwrap(field.type)[0]
        given = raw.get(field.encode_name)
        here = getattr(default, field.name)
        if not isinstance(inner, mi.StructType) or not isinstance(given, dict) or not isinstance(here, msgspec.Struct):
            continue
        filled: dict[str, Any] = {}
        for sub in inner.fields:
            mine = getattr(here, sub.name)
            if isinstance(unwrap(sub.type)[0], mi.StructType) or sub.encode_name in given:
                continue
            if msgspec.to_builtins(mine) != msgspec.to_builtins(_class_default(sub)):
                filled[sub.encode_name] = msgspec.to_builtins(mine)
        out[field.encode_name] = {**filled, **with_section_defaults(given, here)}
    return out


def changed_keys(value: msgspec.Struct, default: msgspec.Struct, prefix: str, only_noop: bool = False) -> list[str]:
    """Dotted leaf keys under ``prefix`` whose value differs from ``default`` (optionally only verl no-op keys)."""
    tp = mi.type_info(type(value))
    assert isinstance(tp, mi.StructType)
    return _changed(tp, value, default, prefix, only_noop, inherited=False)


def _changed(tp: mi.StructType, value: Any, default: Any, prefix: str, only_noop: bool, inherited: bool) -> list[str]:
    out: list[str] = []
    for field in tp.fields:
        inner, _, is_noop = unwrap(field.type)
        is_noop = is_noop or inherited
        key = f"{prefix}{field.encode_name}"
        mine, theirs = getattr(value, field.name), getattr(default, field.name)
        if isinstance(inner, mi.StructType):
            out.extend(_changed(inner, mine, theirs, key + ".", only_noop, is_noop))
        elif (is_noop or not only_noop) and msgspec.to_builtins(mine) != msgspec.to_builtins(theirs):
            out.append(key)
    return out


__all__ = [
    "KeyDoc",
    "allowed_values",
    "changed_keys",
    "coerce",
    "iter_schema",
    "leaf_keys",
    "root_type",
    "suggest",
    "type_at",
    "type_name",
    "unknown_keys",
    "unwrap",
    "with_section_defaults",
]
