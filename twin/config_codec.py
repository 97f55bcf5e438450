"""Turning YAML-shaped data into frozen attrs config classes, and back, with dotted-path errors.

Types come from the classes' annotations: ``int``, ``float``, ``bool``, ``str``, ``X | None``,
``tuple[T, ...]``, ``dict[str, T]``, nested attrs classes, and :class:`~twin.registry.Pluggable` bases whose
concrete class is chosen by the ``kind`` key. Validators on the classes raise ``ValueError``; the loader
re-raises them as :class:`~twin.core.errors.ConfigError` with the field's dotted path.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

import attrs
import yaml

from twin.core.errors import ConfigError
from twin.registry import Pluggable, lookup

T = TypeVar("T")
INT64_MAX = 2**63 - 1

class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, except that a key given twice in one mapping is an error (YAML lets the
    last one win silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, tuple[int, int]] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            mark = key_node.start_mark
            try:  # (by line and column: two keys of a flow mapping share a line)
                first = seen.setdefault(key, (mark.line, mark.column))
            except TypeError:  # an unhashable key: the base class reports it
                break
            if first != (mark.line, mark.column):
                where = f"line {first[0] + 1}" + (f", column {first[1] + 1}" if first[0] == mark.line else "")
                message = f"duplicate key {key!r} (first on {where})"
                raise yaml.constructor.ConstructorError(None, None, message, mark)
        return super().construct_mapping(node, deep)


# YAML 1.1, which PyYAML reads, needs a dot and a signed exponent in a float, so ``1e-3`` and ``2.5e3`` would
# be strings; YAML 1.2 and every other reader take them as numbers, as this loader does.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        if issubclass(tp, Pluggable):
            return f"a {tp.category} mapping with 'kind'"
        if attrs.has(tp):
            return "a mapping"
        return {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}.get(
            tp.__name__, tp.__name__)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    return str(tp)


def convert(tp: Any, value: Any, path: str) -> Any:
    """Check and convert ``value`` to type ``tp``; errors name ``path``."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return convert(arg, value, path)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(path, f"expected {_type_name(tp)}, got {value!r}")
    if origin is tuple:
        (item,) = typing.get_args(tp)[:1]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"expected {_type_name(tp)}, got {value!r}")
        return tuple(convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        _key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {value!r}")
        return {str(k): convert(val_tp, v, f"{path}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if isinstance(tp, type) and (attrs.has(tp) or issubclass(tp, Pluggable)):
        return from_dict(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
                return int(value)  # (1e3; past 2**53 a float is not the integer it reads as: 1e30)
            raise ConfigError(path, f"expected an integer, got {value!r}")
        if abs(value) > INT64_MAX:  # (numpy and the compiled pool count in 64 bits: an OverflowError later)
            raise ConfigError(path, f"expected an integer between -{INT64_MAX} and {INT64_MAX}, "
                                    f"got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {value!r}")
        return value
    raise ConfigError(path, f"unsupported config type {tp!r}")


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """Build ``cls`` (an attrs class, or a Pluggable base resolved by ``kind``) from a mapping."""
    if data is None:
        data = {}
    shorthand = getattr(cls, "from_scalar", None)
    if shorthand is not None and not isinstance(data, dict):
        try:
            return typing.cast(T, shorthand(data))
        except (TypeError, ValueError) as exc:
            raise ConfigError(path, str(exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected {_type_name(cls)}, got {data!r}")
    data = dict(data)
    target: type = cls
    if issubclass(cls, Pluggable):
        kind = data.pop("kind", None)
        if kind is None:
            default_kind = getattr(cls, "default_kind", None)
            if default_kind is None:
                raise ConfigError(f"{path}.kind" if path else "kind", f"missing; expected one of {_kinds(cls)}")
            kind = default_kind
        target = lookup(cls.category, kind, path or cls.category)
    hints = _hints(target)
    fields = {f.name: f for f in attrs.fields(target)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ConfigError(sub, f"unknown key; expected one of {sorted(fields)}")
        kwargs[key] = convert(hints[key], value, sub)
    for name, field in fields.items():
        if field.default is attrs.NOTHING and field.init and name not in kwargs:
            kind = f" (kind {target.kind!r})" if issubclass(target, Pluggable) else ""
            raise ConfigError(f"{path}.{name}" if path else name,
                              f"missing{kind}; expected {_type_name(hints[name])}")
    try:
        return typing.cast(T, target(**kwargs))
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(_field_path(path, exc, fields), _message(exc)) from None


def _kinds(cls: type) -> list[str]:
    from twin.registry import kinds

    return kinds(typing.cast(type[Pluggable], cls).category)


def _field_path(path: str, exc: Exception, fields: dict[str, Any]) -> str:
    """Validators raise ``ValueError("<field> ...")``: point the path at that field when it is one."""
    first = str(exc).split(" ", 1)[0].rstrip(":")
    if first.partition(".")[0] in fields:   # a field, or a key inside one (peak_flops.fp8)
        return f"{path}.{first}" if path else first
    return path


def _message(exc: Exception) -> str:
    return str(exc)


def to_dict(obj: Any) -> Any:
    """Plain YAML-able data of a config object (with ``kind`` for pluggable parts)."""
    if attrs.has(type(obj)):
        out: dict[str, Any] = {}
        if isinstance(obj, Pluggable):
            out["kind"] = obj.kind
        for f in attrs.fields(type(obj)):
            out[f.name] = to_dict(getattr(obj, f.name))
        return out
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def within(path: str, section: str) -> bool:
    """Whether the dotted ``path`` is ``section`` or a field inside it."""
    return path == section or path.startswith(f"{section}.")


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c`` inside nested dicts, creating levels that are missing."""
    parts = dotted.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), f"is {child!r}, not a mapping; cannot set {dotted}")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``path=value`` with the value read as YAML (``64`` is an int, ``[a, b]`` a list, ``null`` None)."""
    path, sep, raw = text.partition("=")
    if not sep or not path.strip():
        raise ConfigError("", f"override {text!r} is not of the form path=value")
    try:
        value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(path.strip(), f"cannot read override value {raw!r}: {exc}") from None
    return path.strip(), value


def key_lines(path: str | Path) -> dict[str, int]:
    """The line (1-based) of every key of a YAML config file, by dotted path (``workload.arrival.kind``);
    empty when the file cannot be read or parsed (its reader reports that)."""
    try:
        root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    lines: dict[str, int] = {}

    def walk(node: yaml.Node | None, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                dotted = f"{prefix}{key.value}"
                lines.setdefault(dotted, key.start_mark.line + 1)
                walk(value, f"{dotted}.")

    walk(root, "")
    return lines


EMPTY_CONFIG = ("the file holds no settings (it is empty, or only comments or null): expected a mapping "
                "with at least one section (model:, hardware:, workload: ...); start from "
                "`twin run --example chat` (`twin run --list-examples` lists them), see "
                "`twin config reference` for every field, or write {} to run every default on purpose")
"""Why an empty config file is refused: one that says nothing ran the defaults without a word (issue 52)."""


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from a file; syntax errors name the file and line. A file with no document (empty, only
    comments) or a null one is refused (:data:`EMPTY_CONFIG`); an explicit ``{}`` asks for every default."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"cannot read config file: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError("", f"not UTF-8 text (byte {exc.start}): a config is a YAML text file",
                          source=str(path)) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError("", f"{where}invalid YAML: {getattr(exc, 'problem', exc)}", source=str(path)) from None
    if data is None:
        raise ConfigError("", EMPTY_CONFIG, source=str(path))
    if not isinstance(data, dict):
        raise ConfigError("", "the top level of a config must be a mapping", source=str(path))
    return data
