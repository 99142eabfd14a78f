"""A name -> (class, init kwargs, description) registry, shared by strategies and accelerators."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from torchfleet.errors import ConfigurationError, unknown_name

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RegistryEntry(Generic[T]):
    """One registered name: the class to build, the keyword arguments to build it with, a description."""

    name: str
    cls: type[T]
    description: str = ""
    init_params: dict[str, Any] = field(default_factory=dict)

    def build(self, **overrides: Any) -> T:
        return self.cls(**{**self.init_params, **overrides})


class Registry(Generic[T]):
    """Names mapped to classes plus init kwargs; ``get`` builds a fresh instance every time.

    Third-party packages add entries through the entry-point group ``entry_point_group``. An entry
    point names either a class (registered under the entry point's name) or a callable that
    receives this registry and registers into it. Entry points are loaded once, on the first
    lookup of a name that is not registered.
    """

    def __init__(self, kind: str, entry_point_group: str, base: type | None = None) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.base = base
        self._entries: dict[str, RegistryEntry[T]] = {}
        self._entry_points_loaded = False

    def register(
        self,
        name: str,
        cls: type[T] | None = None,
        description: str = "",
        override: bool = False,
        **init_params: Any,
    ) -> Any:
        """Register ``cls`` under ``name``; usable as a call or, without ``cls``, as a class decorator."""
        if cls is None:

            def decorator(c: type[T]) -> type[T]:
                self.register(name, c, description=description, override=override, **init_params)
                return c

            return decorator
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"A {self.kind} name must be a non-empty string, got {name!r}.")
        if not isinstance(cls, type):
            raise ConfigurationError(
                f"register({name!r}, ...) needs a class to build, got {cls!r} of type {type(cls).__name__}."
            )
        if self.base is not None and not issubclass(cls, self.base):
            raise ConfigurationError(
                f"register({name!r}, {cls.__name__}) needs a subclass of {self.base.__name__}."
            )
        if name in self._entries and not override:
            raise ConfigurationError(
                f"The {self.kind} name {name!r} is already registered to "
                f"{self._entries[name].cls.__name__}. Pass override=True to replace it, or choose another name."
            )
        self._entries[name] = RegistryEntry(name, cls, description, dict(init_params))
        return cls

    def remove(self, name: str) -> None:
        """Forget ``name``; an unknown name raises the same error as ``get``."""
        if name not in self._entries:
            raise unknown_name(self.kind, name, self._entries)
        del self._entries[name]

    def entry(self, name: str) -> RegistryEntry[T]:
        """The entry registered under ``name`` (entry points are consulted on a miss)."""
        if name not in self._entries and not self._entry_points_loaded:
            self._load_entry_points()
        try:
            return self._entries[name]
        except KeyError:
            raise unknown_name(self.kind, name, self._entries) from None

    def get(self, name: str, **overrides: Any) -> T:
        """Build a fresh instance of the class registered under ``name``."""
        return self.entry(name).build(**overrides)

    def available(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def entries(self) -> list[RegistryEntry[T]]:
        return [self._entries[n] for n in self.available()]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name not in self._entries and not self._entry_points_loaded:
            self._load_entry_points()
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, name: str) -> dict[str, Any]:
        """Lightning's dict view of an entry: ``StrategyRegistry["ddp"]["strategy"]`` is the class, plus
        ``"init_params"`` and ``"description"``. A copy: changing it changes nothing registered."""
        entry = self.entry(name)
        return {"name": entry.name, self.kind: entry.cls, "init_params": dict(entry.init_params),
                "description": entry.description}

    def __iter__(self) -> Iterator[str]:
        """The registered names, sorted (so ``list(StrategyRegistry)`` and ``dict``-style loops work)."""
        return iter(self.available())

    def keys(self) -> list[str]:
        """The registered names, sorted (Lightning's registries are dicts)."""
        return self.available()

    def load_entry_points(self) -> None:
        """Register what installed packages declare in the entry-point group (once)."""
        if not self._entry_points_loaded:
            self._load_entry_points()

    def _load_entry_points(self) -> None:
        self._entry_points_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.entry_point_group):
            try:
                target = ep.load()
                if isinstance(target, type):
                    if ep.name not in self._entries:
                        self.register(ep.name, target, description=(target.__doc__ or "").strip().split("\n")[0])
                else:
                    target(self)
            except Exception as exc:  # a broken plugin must not break every lookup
                log.warning("Could not load %s entry point %r: %s", self.kind, ep.name, exc)
