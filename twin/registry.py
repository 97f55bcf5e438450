"""One registry for every pluggable part: ``(category, kind) -> frozen config class``.

A pluggable config class declares its category by subclassing a :class:`Pluggable` base and registers
its ``kind`` with one decorator; the class's fields are the part's parameters and its ``build`` method
makes the part. User code registers new kinds the same way, without editing the twin::

    @register("router", "my_router")
    @attrs.frozen(kw_only=True)
    class MyRouter(RouterSpec):
        alpha: float = 0.5
        def build(self, ctx): ...
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, ClassVar, TypeVar

from twin.core.errors import ConfigError

T = TypeVar("T", bound=type)

_REGISTRY: dict[str, dict[str, type]] = {}
_DEFERRED: dict[tuple[str, str], str] = {}
"""Kinds registered by a module imported on first use: (category, kind) -> module name."""


class Pluggable:
    """Base of the config classes chosen by ``kind``; subclasses set ``category``."""

    category: ClassVar[str] = ""
    kind: ClassVar[str] = ""


def register(category: str, kind: str) -> Callable[[T], T]:
    """Class decorator adding a config class under ``category`` / ``kind``."""

    def deco(cls: T) -> T:
        table = _REGISTRY.setdefault(category, {})
        if kind in table and table[kind] is not cls:
            raise ValueError(f"{category} kind {kind!r} is already registered by {table[kind].__qualname__}")
        if not (isinstance(cls, type) and issubclass(cls, Pluggable)):
            raise TypeError(f"{cls!r} must subclass a Pluggable base to be registered")
        if cls.category != category:
            raise TypeError(f"{cls.__qualname__} has category {cls.category!r}, not {category!r}")
        cls.kind = kind  # type: ignore[attr-defined]
        table[kind] = cls
        return cls

    return deco


def register_deferred(category: str, kind: str, module: str) -> None:
    """Announce a kind that ``module`` registers when imported, so a run that never uses it never pays for
    importing it (the live-serving workload pulls in an HTTP server)."""
    _DEFERRED[(category, kind)] = module


def lookup(category: str, kind: Any, path: str) -> type:
    """The class registered for ``kind``, or a ConfigError naming ``path`` and the known kinds."""
    table = _REGISTRY.get(category, {})
    if isinstance(kind, str) and kind not in table and (category, kind) in _DEFERRED:
        importlib.import_module(_DEFERRED[(category, kind)])
        table = _REGISTRY.get(category, {})
    if not isinstance(kind, str) or kind not in table:
        raise ConfigError(f"{path}.kind", f"unknown {category} kind {kind!r}; expected one of {kinds(category)}")
    return table[kind]


def kinds(category: str) -> list[str]:
    """Every kind of ``category``, deferred ones included."""
    return sorted({*_REGISTRY.get(category, {}), *(k for c, k in _DEFERRED if c == category)})
