"""The standard library at a Worker's top level, as workerd has it, and the first request.

Before the Worker's modules are imported (`before_top_level`):
- `os.urandom` raises `OSError(29, "Cannot get entropy outside of request
  context")` (so do `uuid.uuid4()`, `secrets`, `random.SystemRandom`);
- `random`'s functions raise `RuntimeError("Cannot use random.random()
  outside of request context")`; `random.Random` and `random.SystemRandom`
  can still be named (an unseeded `Random()` fails like `os.urandom`);
- `tempfile` names temporary files from a fixed sequence;
- importing `multiprocessing.process` may take its one entropy call.
Pyodide imports `random`, `_random` and `tempfile` while it boots, before
this can run, so they are patched in place rather than at their import.

`before_first_request` undoes all of it, runs the hooks registered for the
modules imported meanwhile (the SDK's reseed numpy, say), and reseeds `random`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from . import import_patch_manager
from .allow_entropy import (
    allow_bad_entropy_calls,
    enter_request_context,
    in_request_context,
    raise_unless_entropy_allowed,
)

_real_urandom = os.urandom
_undo: list[Callable[[], None]] = []


def _urandom(size: int, /) -> bytes:
    raise_unless_entropy_allowed()
    return _real_urandom(size)


def _when_imported(name: str, apply: Callable[[Any], None]) -> None:
    """Apply a patch to module `name` now if it is imported, else right after its import."""
    if name in sys.modules:
        apply(sys.modules[name])
        return

    @contextmanager
    def after_exec(module: ModuleType) -> Iterator[None]:
        yield
        apply(module)

    import_patch_manager.register_exec_patch(name, after_exec)


def _guard_unseeded_random(_random: Any) -> None:
    # Random() and Random.seed(None) seed from getentropy(): refuse like os.urandom.
    original = _random.Random.seed

    def seed(self: Any, n: Any = None, /) -> None:
        if n is None:
            raise_unless_entropy_allowed()
        original(self, n)

    _random.Random.seed = seed
    _undo.append(lambda: setattr(_random.Random, "seed", original))


def _block_random(random: Any) -> None:
    random._urandom = _urandom  # bound at its import; SystemRandom reads through it
    import_patch_manager.block_calls(random, allowlist=("Random", "SystemRandom"))
    _undo.append(random.seed)  # a fresh seed for the first request, as workerd reseeds


class _FixedNameSequence:
    """tempfile's candidate names at top level: a fixed sequence, no random state."""

    characters = "abcdefghijklmnopqrstuvwxyz0123456789_"

    def __init__(self) -> None:
        self.count = 0

    def __iter__(self) -> _FixedNameSequence:
        return self

    def __next__(self) -> str:
        self.count += 1
        n, letters = self.count, []
        for _ in range(8):
            n, digit = divmod(n, len(self.characters))
            letters.append(self.characters[digit])
        return "".join(letters)


def _fixed_tempfile_names(tempfile: Any) -> None:
    original = tempfile._RandomNameSequence
    tempfile._RandomNameSequence = _FixedNameSequence
    _undo.append(lambda: setattr(tempfile, "_RandomNameSequence", original))


@contextmanager
def _one_entropy_call(module: ModuleType) -> Iterator[None]:
    with allow_bad_entropy_calls(1):  # multiprocessing.process makes an authkey at import
        yield


def before_top_level() -> None:
    """Install the top-level rules; idempotent."""
    if in_request_context() or os.urandom is _urandom:
        return
    os.urandom = _urandom
    _undo.append(lambda: setattr(os, "urandom", _real_urandom))
    import_patch_manager.install()
    _when_imported("_random", _guard_unseeded_random)
    _when_imported("random", _block_random)
    _when_imported("tempfile", _fixed_tempfile_names)
    import_patch_manager.register_exec_patch("multiprocessing.process", _one_entropy_call)


def before_first_request() -> None:
    """Leave top level for good: entropy and `random` work from here on; idempotent."""
    if in_request_context():
        return
    enter_request_context()
    import_patch_manager.remove()
    for undo in _undo:
        undo()
    _undo.clear()
    import_patch_manager.run_first_request_hooks()
