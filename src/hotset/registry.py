"""Registries of classes by name (policies, samplers), and the import of every module
of a package so that a new class is one new file that registers itself."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterable

from hotset.errors import ConfigError


class Registry(dict):
    """``name -> class`` for one kind of component; ``register`` refuses a name another
    class took, ``lookup`` names the choices when a name is unknown."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, cls: type) -> type:
        """Class decorator: make ``cls`` available by ``cls.name``."""
        taken = self.get(cls.name)
        if taken is not None and taken is not cls:
            raise ConfigError(f"{self.kind} name {cls.name!r} is taken by {taken.__qualname__}")
        self[cls.name] = cls
        return cls

    def lookup(self, name: str) -> type:
        """The class registered as ``name`` (a clear error for an unknown one)."""
        try:
            return self[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {name!r}; choose from: {', '.join(sorted(self))}"
            ) from None

    def options_for(self, name: str, options: dict) -> dict:
        """Those of ``options`` that class ``name``'s constructor (or a base's) takes."""
        params: set[str] = set()
        for klass in self.lookup(name).__mro__:
            init = vars(klass).get("__init__")
            if init is not None:
                params.update(inspect.signature(init).parameters)
        return {k: v for k, v in options.items() if k in params}


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every module of ``package`` (its ``__name__`` and ``__path__``)."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")
