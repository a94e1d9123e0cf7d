"""Public names imported on first use (PEP 562), for packages whose modules run inside Spark Python workers."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy_exports(package: str, homes: dict[str, str]) -> Callable[[str], object]:
    """A package's module ``__getattr__`` that imports each public name from its module (``homes``: name ->
    module of the package) when it is first asked for. A Spark worker that unpickles a task function imports
    the task's module and what it needs, not every module the package's face re-exports (the driver's job, the
    metastore client and its HTTP server: 0.8 s of imports per worker for an ingest task before)."""

    def attribute(name: str) -> object:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{homes[name]}"), name)

    return attribute
