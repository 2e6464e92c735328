"""Classes by name, from an entry-point group: the one loader of the harness's open seams.

Environments (``validate.environments``), sandbox backends (``validate.backends``), attempt
kinds (``validate.attempt_kinds``) and executors (``validate.executors``) are each a
`Registry`: the entry points of one group, in every installed distribution, plus the
classes registered at run time (`Registry.register`). A name is listed without importing
anything (entry-point metadata only); its class is imported on first use and checked: a
subclass of the seam's base whose own name attribute is that name. A missing name, a
package that does not import, or a class of the wrong kind is one error naming the field
and, for a missing name, the installed ones.
"""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """The classes of one entry-point group, by name (see the module)."""

    def __init__(self, group: str, *, base: type[T], key: str, field: str, kind: str,
                 error: type[Exception]) -> None:
        #: `group`: the entry-point group; `key`: the class attribute holding its name;
        #: `field`: how errors name the field (``environment.name``); `kind`: what a name names.
        self.group, self.base, self.key = group, base, key
        self.field, self.kind, self.error = field, kind, error
        self._registered: dict[str, type[T]] = {}
        self._loaded: dict[str, type[T]] = {}
        self._scanned: tuple[tuple[str, ...], dict[str, EntryPoint]] | None = None

    def register(self, cls: type[T]) -> type[T]:
        """Make `cls` available under its name in this process (usable as a decorator)."""
        name = getattr(cls, self.key)
        self._registered[name] = cls
        self._loaded.pop(name, None)
        return cls

    def unregister(self, cls: type[T]) -> None:
        """Undo `register` of `cls` (a test's class must not outlive the test)."""
        name = getattr(cls, self.key)
        if self._registered.get(name) is cls:
            del self._registered[name]
            self._loaded.pop(name, None)

    def _entry_points(self) -> dict[str, EntryPoint]:
        # Scanning every distribution costs milliseconds and a contract's backend is checked at
        # each read of a manifest, so the scan is kept per sys.path: a distribution put on the
        # path later (a test's) is still seen.
        key = tuple(sys.path)
        if self._scanned is None or self._scanned[0] != key:
            eps = {ep.name: ep for ep in sorted(entry_points(group=self.group), key=lambda ep: ep.name)}
            self._scanned = (key, eps)
        return self._scanned[1]

    def names(self) -> list[str]:
        """Every name registered, sorted; nothing is imported."""
        return sorted({*self._entry_points(), *self._registered})

    def unknown(self, name: str) -> str:
        """The message for a name nobody registered, naming the installed ones."""
        known = ", ".join(self.names()) or "none (is the project installed? pip install -e .)"
        shown = name if len(name) <= 80 else name[:80] + "…"  # a hostile manifest's name stays one short line
        return f"no {self.kind} named {shown!r}; installed: {known}"

    def load(self, name: str) -> type[T]:
        """The class registered under `name`, imported once; `self.error` naming the field if
        it is unknown, does not import, or is not a subclass of the seam's base named `name`."""
        if name in self._loaded:
            return self._loaded[name]
        if name in self._registered:
            cls = self._registered[name]
        else:
            ep = self._entry_points().get(name)
            if ep is None:
                raise self.error(f"{self.field}: {self.unknown(name)}")
            try:
                cls = ep.load()
            except Exception as e:  # noqa: BLE001 - a broken third-party package is reported, not a crash
                raise self.error(f"{self.field}: the package registering {name!r} ({ep.value}) does not "
                                 f"import: {type(e).__name__}: {e}") from None
        if not (isinstance(cls, type) and issubclass(cls, self.base)) or getattr(cls, self.key, None) != name:
            raise self.error(f"{self.field}: {name!r} is registered to {cls!r}, which is not a "
                             f"{self.base.__name__} subclass whose {self.key} is {name!r}")
        self._loaded[name] = cls
        return cls
