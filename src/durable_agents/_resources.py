"""Reading the kit's package data (the schema's `stores/migrations/*.sql`, pages, styles)
the same way on CPython and in the Worker.

In a Worker, scripts/build_worker.py stages each package's data files beside its modules
and wrangler.toml's `[[rules]]` uploads them as Text modules, which workerd shows to
Python as read-only files beside the modules: `importlib.resources` finds them there as
it does in an installed or source package. Read them when first needed, not at import.
Guide: docs/architecture.md.
"""

from __future__ import annotations

__all__ = ["file_names", "read_text"]


def read_text(package: str, name: str) -> str:
    """The text (UTF-8) of the data file `name` of `package` (a dotted package name; `name`
    may be a path below it, "migrations/0001_init.sql"). OSError if it is missing."""
    import importlib.resources  # as the files: when first needed (~20 ms of a Worker's start)

    return importlib.resources.files(package).joinpath(*name.split("/")).read_text("utf-8")


def file_names(package: str, folder: str, suffix: str) -> list[str]:
    """The names of the files ending in `suffix` in the data folder `folder` of `package`,
    sorted. OSError if the folder is missing."""
    import importlib.resources

    found = importlib.resources.files(package).joinpath(*folder.split("/"))
    return sorted(entry.name for entry in found.iterdir() if entry.name.endswith(suffix))
