"""Why an agent module did not load, said for its developer: the file, the line, and the
fix (the package that provides a missing module and `scripts/add-package`, or the name an
annotation uses that the module does not define). `agent_module.import_agent` raises it
as a ConfigurationError; docs/packages.md ("When the Worker lacks a module")."""

from __future__ import annotations

import ast
import os
import re
import traceback
from collections.abc import Iterator, Mapping
from types import TracebackType

__all__ = ["excluded_by", "explain_load_error"]


def explain_load_error(
    exc: BaseException,
    file: str,
    shown_as: str | None = None,
    packages: Mapping[str, str] | None = None,
    excluded: Mapping[str, str] | None = None,
) -> str:
    """What to tell a developer whose agent module at `file` raised `exc` on import.

    `<shown_as> does not load: line N (`the line`): <exception>`, the line being the
    last one of `file` in the traceback, then the fix: for a missing module
    (`ModuleNotFoundError`, also as the cause of another error) the package that
    provides it (`packages`: import name -> package, e.g. `{"yaml": "pyyaml"}`) and
    `scripts/add-package`, or, for one wrangler.toml's `[python_modules] exclude` leaves
    out of the Worker (`excluded`: module name -> its pattern), that entry; for a name
    that an annotation uses and the module does not define (a missing import, a typo,
    often raised by pydantic far from the module), the line of that annotation and its
    class or function.
    """
    shown = shown_as or file
    at = _line_of(exc, file)
    chain = list(_chain(exc))
    missing = next((e for e in chain if isinstance(e, ModuleNotFoundError) and e.name), None)
    if missing is not None and missing.name is not None:
        pattern = excluded_by(missing.name, excluded or {})
        fix = (
            _missing_module(missing.name, packages or {}, chain)
            if pattern is None
            else f"ModuleNotFoundError: No module named {missing.name!r}: python_modules/ has "
            f"it, but wrangler.toml's [python_modules] exclude leaves it out of the Worker "
            f"({pattern!r}): delete that entry"
        )
        return f"{shown} does not load: {at}{fix}"
    name = _undefined_name(chain)
    if name is None:
        return f"{shown} does not load: {at}{type(exc).__name__}: {_first_line(exc)}"
    annotated = [] if _raised_in(exc, file) else _annotations_naming(file, name)
    if annotated:
        line, what = annotated[0]
        at = f"line {line} ({what}): "
    return (
        f"{shown} does not load: {at}`{name}` is not defined in the module: import it, or "
        f"correct its spelling ({type(exc).__name__}: {_first_line(exc)})"
    )


# A library's advice on what to install (pydantic's: "run `pip install 'pydantic[email]'`").
_PIP_INSTALL = re.compile(r"pip install ['\"`]?([A-Za-z0-9][A-Za-z0-9._\[\],-]*)")
# pydantic's and Python's words for an undefined name.
_UNDEFINED_NAME = re.compile(r"name '([A-Za-z_]\w*)' is not defined|should define `([A-Za-z_]\w*)`")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _first_line(exc: BaseException) -> str:
    return next(iter(str(exc).strip().splitlines()), "")


def _same_file(a: str | None, b: str) -> bool:
    return a is not None and os.path.normpath(a) == os.path.normpath(b)


def _frames(tb: TracebackType | None) -> traceback.StackSummary:
    return traceback.extract_tb(tb)


def _line_of(exc: BaseException, file: str) -> str:
    """`line N (`code`): ` for the last line of `file` the failure went through, or ''."""
    if isinstance(exc, SyntaxError) and _same_file(exc.filename, file) and exc.lineno:
        return f"line {exc.lineno}: "
    frames = [f for f in _frames(exc.__traceback__) if _same_file(f.filename, file)]
    if not frames:
        return ""
    code = (frames[-1].line or "").strip()
    return f"line {frames[-1].lineno} (`{code}`): " if code else f"line {frames[-1].lineno}: "


def _raised_in(exc: BaseException, file: str) -> bool:
    frames = _frames(exc.__traceback__)
    return bool(frames) and _same_file(frames[-1].filename, file)


def excluded_by(module: str, excluded: Mapping[str, str]) -> str | None:
    """The pattern of `excluded` (module name -> the `[python_modules] exclude` pattern
    leaving it out of the Worker) that leaves `module`, or a package holding it, out."""
    parts = module.split(".")
    names = (".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return next((excluded[name] for name in names if name in excluded), None)


def _missing_module(module: str, packages: Mapping[str, str], chain: list[BaseException]) -> str:
    """The missing module and the command that adds its package: the package `packages`
    names for it, else the one a library's own error says to install (pydantic's EmailStr:
    "run `pip install 'pydantic[email]'`")."""
    top = module.split(".")[0]
    said = next(filter(None, (_PIP_INSTALL.search(str(e)) for e in chain)), None)
    package = packages.get(top) or (said.group(1) if said else None)
    if package:
        quoted = f"'{package}'" if "[" in package else package
        fix = f"add the package that provides it: `scripts/add-package {quoted}`"
    else:
        fix = (
            f"if `{top}` comes from a package, add that package: `scripts/add-package "
            "<its name on PyPI>`; a module of your own goes in src/"
        )
    return (
        f"ModuleNotFoundError: No module named {module!r}: {fix} (into the Worker's "
        "python_modules/ and .venv; a running scripts/dev reloads the Worker)"
    )


def _undefined_name(chain: list[BaseException]) -> str | None:
    for exc in chain:
        name = getattr(exc, "name", None) if isinstance(exc, NameError) else None
        if isinstance(name, str):
            return name
        match = _UNDEFINED_NAME.search(str(exc))
        if match:
            return match.group(1) or match.group(2)
    return None


def _annotations_naming(file: str, name: str) -> list[tuple[int, str]]:
    """Where the module at `file` uses `name` in an annotation, by line: a class's field,
    a function's parameter or return."""
    try:
        with open(file, encoding="utf-8") as source:
            tree = ast.parse(source.read(), file)
    except (OSError, SyntaxError, ValueError):
        return []
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found += [
                (item.lineno, f"class {node.name}, `{ast.unparse(item).split(' = ')[0]}`")
                for item in node.body
                if isinstance(item, ast.AnnAssign) and _names(item.annotation, name)
            ]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            found += [
                (arg.lineno, f"def {node.name}, `{arg.arg}: {ast.unparse(arg.annotation)}`")
                for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
                if arg.annotation is not None and _names(arg.annotation, name)
            ]
            if node.returns is not None and _names(node.returns, name):
                found.append((node.lineno, f"def {node.name}, `-> {ast.unparse(node.returns)}`"))
    return sorted(found)


def _names(annotation: ast.expr, name: str) -> bool:
    """Whether `annotation` uses `name` (also inside a string: a forward reference)."""
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == name:
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                inner = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                continue
            if _names(inner, name):
                return True
    return False
