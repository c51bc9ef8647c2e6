"""Run context managers around chosen modules' import, until the first request.

`register_exec_patch(name, cm)` makes `import name` execute the module's body
inside `cm(module)`; `register_create_patch(name, cm)` wraps the creation of
an extension module in `cm(spec)`. Both work as decorators and stack. A
finder placed first on `sys.meta_path` finds the module with the other
finders and wraps its loader. `register_before_first_request(name, fn)` runs
`fn(module)` before the first request if `name` was imported meanwhile;
`register_after_snapshot` hooks are kept but never run (the local runtime
takes no memory snapshot). `block_calls(module)` replaces the module in
`sys.modules` by a proxy whose functions refuse to run outside a request.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from .allow_entropy import in_request_context

ContextFactory = Callable[[Any], AbstractContextManager[Any]]
Hook = Callable[[ModuleType], None]


@dataclass
class _Patches:
    create: ContextFactory = nullcontext
    exec: ContextFactory = nullcontext
    before_first_request: list[Hook] = field(default_factory=list)
    after_snapshot: list[Hook] = field(default_factory=list)


_patches: dict[str, _Patches] = {}
_first_request_hooks: list[Callable[[], None]] = []
_snapshot_hooks: list[Callable[[], None]] = []
_blocked: dict[str, ModuleType] = {}


def _register(kind: str, name: str, value: Any) -> Any:
    if value is None:  # used as @register_...(name)
        return functools.partial(_register, kind, name)
    patches = _patches.setdefault(name, _Patches())
    if kind in ("create", "exec"):
        setattr(patches, kind, value)
    else:
        getattr(patches, kind).append(value)
    return value


def register_create_patch(name: str, context_manager: ContextFactory | None = None) -> Any:
    """Create extension module `name` inside `context_manager(spec)`."""
    return _register("create", name, context_manager)


def register_exec_patch(name: str, context_manager: ContextFactory | None = None) -> Any:
    """Execute module `name` inside `context_manager(module)`."""
    return _register("exec", name, context_manager)


def register_before_first_request(name: str, handler: Hook | None = None) -> Any:
    """Call `handler(module)` before the first request, if `name` gets imported at top level."""
    return _register("before_first_request", name, handler)


def register_after_snapshot(name: str, handler: Hook | None = None) -> Any:
    """Kept for the SDK's patches; the local runtime takes no snapshot, so it never runs."""
    return _register("after_snapshot", name, handler)


class _PatchedLoader(Loader):
    """The module's own loader, run inside the registered context managers."""

    def __init__(self, loader: Any, patches: _Patches) -> None:
        self._loader = loader
        self._module_patches = patches

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        with self._module_patches.create(spec):
            module: ModuleType | None = self._loader.create_module(spec)
            return module

    def exec_module(self, module: ModuleType) -> None:
        for hook in self._module_patches.before_first_request:
            _first_request_hooks.append(functools.partial(hook, module))
        for hook in self._module_patches.after_snapshot:
            _snapshot_hooks.append(functools.partial(hook, module))
        with self._module_patches.exec(module):
            self._loader.exec_module(module)


class _PatchFinder(MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        patches = _patches.get(fullname)
        if patches is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchedLoader(spec.loader, patches)
                return spec
        return None


_finder = _PatchFinder()


def install() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def remove() -> None:
    """Before the first request: stop patching imports and unblock the blocked modules."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name, module in _blocked.items():
        sys.modules[name] = module
    _blocked.clear()


def run_first_request_hooks() -> None:
    hooks = list(_first_request_hooks)
    _first_request_hooks.clear()
    for hook in hooks:
        hook()


class _BlockedModule:
    """Stands in for a module in `sys.modules` at top level: reading an attribute
    works, but calling one of its functions (other than `allowlist`) outside a
    request raises. Functions taken from it keep that check when called later."""

    def __init__(self, module: ModuleType, allowlist: Sequence[str]) -> None:
        object.__setattr__(self, "_blocked_module", module)
        object.__setattr__(self, "_blocked_allowlist", frozenset(allowlist))

    def __getattribute__(self, name: str) -> Any:
        module: ModuleType = object.__getattribute__(self, "_blocked_module")
        value = getattr(module, name)
        allowlist: frozenset[str] = object.__getattribute__(self, "_blocked_allowlist")
        if in_request_context() or not callable(value) or name in allowlist:
            return value
        if name.startswith("__") and name.endswith("__"):
            return value
        return _refusing_outside_requests(module.__name__, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_blocked_module"), name, value)

    def __dir__(self) -> list[str]:
        return dir(object.__getattribute__(self, "_blocked_module"))


def _refusing_outside_requests(module: str, name: str, function: Any) -> Any:
    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if not in_request_context():
            raise RuntimeError(f"Cannot use {module}.{name}() outside of request context")
        return function(*args, **kwargs)

    return guarded


def block_calls(module: ModuleType, *, allowlist: Sequence[str] = ()) -> None:
    """Until the first request, `import <module>` gives a proxy whose functions refuse to run."""
    _blocked[module.__name__] = module
    sys.modules[module.__name__] = _BlockedModule(module, allowlist)  # type: ignore[assignment]
