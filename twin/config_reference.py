"""The configuration reference, generated from the config classes themselves: Markdown for people
(``docs/config.md``, ``twin config reference``) and a JSON Schema for editors (``twin config schema``).

Every section and every registered kind of a pluggable section is walked; a field's type comes from its
annotation, its default from the class, and its meaning from the docstring written under it in the source
(read with ``ast``, since Python keeps no attribute docstrings at run time).
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import textwrap
import types
import typing
from typing import Any, Union

import attrs

from twin.config_codec import _hints, _type_name
from twin.registry import Pluggable, lookup
from twin.registry import kinds as registered_kinds


def kinds(category: str) -> list[str]:
    """The built-in kinds of ``category`` (those the twin ships; user code may register more)."""
    return [k for k in registered_kinds(category)
            if lookup(category, k, category).__module__.split(".")[0] in ("twin", "workloads")]


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it in ``cls``'s source (and its bases'), one paragraph."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not attrs.has(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
            tree = ast.parse(source)
        except (OSError, TypeError, SyntaxError):
            continue
        lines = source.splitlines()
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, [*body[1:], None]):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                out[node.target.id] = " ".join(after.value.value.split())
            else:   # a comment at the end of the field's last line
                last = lines[(node.end_lineno or node.lineno) - 1]
                code, sep, comment = last.partition("  # ")
                if sep and comment.strip() and "type: ignore" not in comment:
                    out[node.target.id] = comment.strip()
    return out


def _default_text(field: "attrs.Attribute[Any]") -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return "(section defaults)"
    if default is None:
        return "null"
    return json.dumps(default) if isinstance(default, (bool, int, float, str, list, tuple)) else repr(default)


def _sections() -> list[tuple[str, type]]:
    from twin.config import TwinConfig

    hints = _hints(TwinConfig)
    return [(f.name, hints[f.name]) for f in attrs.fields(TwinConfig) if f.name != "name"]


def _nested(cls: type) -> list[tuple[str, type]]:
    """Sections inside a section (hardware.scale, engine.speculative, a pool of a disaggregated system)."""
    hints = _hints(cls)
    out = []
    for f in attrs.fields(cls):
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        for a in args:
            if isinstance(a, type) and attrs.has(a) and not issubclass(a, Pluggable):
                out.append((f.name, a))
    return out


def _table(cls: type, path: str) -> list[str]:
    hints, docs = _hints(cls), field_docs(cls)
    lines = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for f in attrs.fields(cls):
        if not f.init:
            continue
        meaning = docs.get(f.name, "").replace("|", "\\|")
        lines.append(f"| `{path}.{f.name}` | {_type_name(hints[f.name])} | {_default_text(f)} | {meaning} |")
    for name, sub in _nested(cls):
        lines += ["", f"`{path}.{name}`:", "", *_table(sub, f"{path}.{name}")]
    return lines


def reference() -> str:
    """The whole reference as Markdown."""
    import twin.builtin_kinds  # noqa: F401  (registers the built-in kinds)

    out = ["# Configuration reference", "",
           "Generated from the config classes by `twin config reference` (a test keeps this file in step with",
           "them). Every section has defaults; a field left `null` takes the engine's default for the chosen",
           "GPU when the run is built (the resolved `config.yaml` of a run lists every value). Sections chosen",
           "by `kind` list each kind's own fields.", ""]
    for name, tp in _sections():
        out += [f"## `{name}`", ""]
        if isinstance(tp, type) and issubclass(tp, Pluggable):
            default = getattr(tp, "default_kind", None)
            out += [f"Chosen by `{name}.kind`: {', '.join(f'`{k}`' for k in kinds(tp.category))}"
                    + (f" (default `{default}`)." if default else "."), ""]
            for kind in kinds(tp.category):
                cls = lookup(tp.category, kind, name)
                doc = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())
                out += [f"### `{name}.kind: {kind}`", "", *([doc, ""] if doc else []), *_table(cls, name), ""]
        else:
            doc = " ".join((inspect.getdoc(tp) or "").split("\n\n")[0].split())
            out += [*([doc, ""] if doc else []), *_table(tp, name), ""]
    for path, category in _nested_categories():
        out += [f"## `{path}`", "", f"Chosen by `{path}.kind`: {', '.join(f'`{k}`' for k in kinds(category))}.", ""]
        for kind in kinds(category):
            cls = lookup(category, kind, path)
            doc = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())
            out += [f"### `{path}.kind: {kind}`", "", *([doc, ""] if doc else []), *_table(cls, path), ""]
    return "\n".join(out).rstrip() + "\n"


def _nested_categories() -> list[tuple[str, str]]:
    """Pluggable fields inside a pluggable section's kinds (``workload.arrival``), by dotted path."""
    seen: dict[str, str] = {}
    for name, tp in _sections():
        if not (isinstance(tp, type) and issubclass(tp, Pluggable)):
            continue
        for kind in kinds(tp.category):
            cls = lookup(tp.category, kind, name)
            for f in attrs.fields(cls):
                ftp = _hints(cls)[f.name]
                for a in [a for a in typing.get_args(ftp) if a is not type(None)] or [ftp]:
                    if isinstance(a, type) and issubclass(a, Pluggable):
                        seen.setdefault(f"{name}.{f.name}", a.category)
    return sorted(seen.items())


# ------------------------------------------------------------------------------------------ JSON Schema
def _schema_of(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema_of(a) for a in typing.get_args(tp)]}
    if origin is tuple:
        return {"type": "array", "items": _schema_of(typing.get_args(tp)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema_of(typing.get_args(tp)[1])}
    if tp is type(None):
        return {"type": "null"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if isinstance(tp, type) and issubclass(tp, Pluggable):
        return {"anyOf": [_object_schema(lookup(tp.category, k, tp.category), kind=k) for k in kinds(tp.category)]}
    if isinstance(tp, type) and attrs.has(tp):
        return _object_schema(tp)
    return {}


def _object_schema(cls: type, kind: str | None = None) -> dict[str, Any]:
    hints, docs = _hints(cls), field_docs(cls)
    props: dict[str, Any] = {}
    for f in attrs.fields(cls):
        if not f.init:
            continue
        prop = _schema_of(hints[f.name])
        if f.name in docs:
            prop["description"] = docs[f.name]
        if f.default is not attrs.NOTHING and not isinstance(f.default, attrs.Factory):  # type: ignore[arg-type]
            default = f.default
            if isinstance(default, (bool, int, float, str)) or default is None:
                prop["default"] = default
        props[f.name] = prop
    if kind is not None:
        props = {"kind": {"const": kind}, **props}
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    doc = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())
    if doc and kind is not None:
        out["description"] = doc
    required = [f.name for f in attrs.fields(cls) if f.init and f.default is attrs.NOTHING]
    if required:
        out["required"] = required
    return out


def schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of a config file."""
    import twin.builtin_kinds  # noqa: F401
    from twin.config import TwinConfig

    body = _object_schema(TwinConfig)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "ServeTwin config", **body}
