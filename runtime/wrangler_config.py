"""A Worker's wrangler config read as wrangler reads it (TOML, JSON or JSONC), for the dev
server (runtime/dev.py) and the deploy check (runtime/deploy_check.py) alike: only what
they need of it (`main`, [vars], bindings); wrangler reads the rest itself.

Which config a command serves or checks: docs/dev-server.md (`--config`) and
docs/deploy.md (scripts/check-deploy).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The names wrangler looks for in a project's folder, in its order.
CONFIG_NAMES = ("wrangler.json", "wrangler.jsonc", "wrangler.toml")


class ConfigError(Exception):
    """A config that cannot be read, or names no `main`; its text says which and why."""


def jsonc(text: str) -> Any:
    """JSON with comments (`//` to the line's end, `/* */`) and trailing commas (before `}`
    or `]`), as wrangler reads wrangler.json and wrangler.jsonc: outside strings only (a
    string's `//`, `/*` and `, }` are its text; a backslash escapes its next character).
    Comments and trailing commas become spaces, so an error's line and column
    (json.JSONDecodeError, a ValueError) are those of `text`."""
    out = list(text)
    i, n = 0, len(text)
    comma = -1  # a comma outside strings with no value after it yet

    def blank(start: int, stop: int) -> None:
        out[start:stop] = [c if c in "\r\n" else " " for c in text[start:stop]]

    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            comma = -1
        elif text.startswith("//", i):
            stop = text.find("\n", i)
            stop = n if stop < 0 else stop
            blank(i, stop)
            i = stop - 1
        elif text.startswith("/*", i):
            stop = text.find("*/", i + 2)
            if stop < 0:
                raise json.JSONDecodeError("Unterminated /* comment", text, i)
            blank(i, stop + 2)
            i = stop + 1
        elif c in "}]" and comma >= 0:
            out[comma] = " "
            comma = -1
        elif c == ",":
            comma = i if comma < 0 else -1  # `,,` is no trailing comma: JSON's error
        elif not c.isspace():
            comma = -1
        i += 1
    return json.loads("".join(out))


def load_config(file: Path) -> dict[str, Any]:
    """The config in `file` (by its suffix: .toml, else JSONC); ConfigError if it cannot be
    read or has no `main` (the Worker's entry module)."""
    try:
        text = file.read_text()
        config = tomllib.loads(text) if file.suffix == ".toml" else jsonc(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from exc
    if not isinstance(config, dict) or not isinstance(config.get("main"), str):
        raise ConfigError(f"{file}: no `main` (the Worker's entry module)")
    return config


def project_config(project: Path) -> Path:
    """The config wrangler would read in `project`'s folder; ConfigError if none is there."""
    for name in CONFIG_NAMES:
        if (project / name).is_file():
            return project / name
    raise ConfigError(
        f"no wrangler.json, wrangler.jsonc or wrangler.toml in {project}; pass --config"
    )


def config_bindings(config: Mapping[str, Any]) -> list[str]:
    """The names of the bindings a Worker's config declares (the Workers AI binding, D1,
    Durable Objects, KV, R2, services, queues): what its env holds beside the settings."""
    names = []
    ai = config.get("ai")
    if isinstance(ai, Mapping) and ai.get("binding"):
        names.append(str(ai["binding"]))
    for key in ("d1_databases", "kv_namespaces", "r2_buckets", "services"):
        names += [str(b.get("binding")) for b in config.get(key) or [] if b.get("binding")]
    durable_objects = config.get("durable_objects") or {}
    names += [str(b.get("name")) for b in durable_objects.get("bindings") or [] if b.get("name")]
    queues = config.get("queues") or {}
    names += [str(b.get("binding")) for b in queues.get("producers") or [] if b.get("binding")]
    return names
