"""An agent module that does not load says where and what to do (issue 32), on CPython.

- `import_agent` (what the Worker's entry, the dev server and scripts/check-deploy load the
  agent with): the file, the line and the fix for a missing module (the package that
  provides it and `scripts/add-package`), for a name an annotation uses that the module
  does not define (pydantic raises it far from the module: the annotation's line), for
  any exception at import, a syntax error, a breach of the protocol.
- `serve_agent`: under the dev server (its note module staged beside the entry) a stand-in
  agent and the message; deployed, the error itself (Cloudflare refuses the Worker).
- The dev server's check of the agent's imports against python_modules/
  (runtime/agent_checks.py `modules_the_worker_lacks`), said once, and its note module.

The same Worker on workerd: tests/cloudflare/test_dev_server_settings.py.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from tests.support.served_worker import runtime_module

from durable_agents import ConfigurationError
from durable_agents.cloudflare import agent_module
from durable_agents.cloudflare.agent_module import DEV_SERVER_NOTE, serve_agent

agent_checks = runtime_module("agent_checks")
dev = runtime_module("dev")

TAIL = (
    "from durable_agents import Agent\n"
    "AGENT = Agent('a', 'Be brief.')\ndef make_deps(env, http):\n    return None\n"
)


@pytest.fixture(autouse=True)
def _agent_module_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    # Loading a file as `agent` replaces the module of that name (tests/test_agent.py's).
    monkeypatch.setitem(sys.modules, "agent", sys.modules.get("agent"))
    monkeypatch.delitem(sys.modules, "agent")


def failure(file: Path, packages: Mapping[str, str] | None = None) -> str:
    with pytest.raises(ConfigurationError) as raised:
        agent_checks.load_agent(file, packages=packages)
    return str(raised.value)


@pytest.mark.parametrize(
    ("source", "says"),
    [
        pytest.param(
            "from __future__ import annotations\n"
            "from pydantic import BaseModel\nfrom durable_agents import Agent, tool\n\n"
            "class Loan(BaseModel):\n    id: str\n    until: datetime\n\n"
            "@tool\nasync def renew(args: Loan) -> str:\n    return 'ok'\n\n" + TAIL,
            "line 7 (class Loan, `until: datetime`): `datetime` is not defined in the module: "
            "import it, or correct its spelling (PydanticUserError: `Loan` is not fully defined",
            id="a tool's model, raised by pydantic at @tool",
        ),
        pytest.param(
            "from __future__ import annotations\nfrom pydantic import BaseModel\n"
            "from durable_agents import Agent\n\n"
            "class Found(BaseModel):\n    genre: 'Genra'\n\n" + TAIL,
            "line 6 (class Found, `genre: 'Genra'`): `Genra` is not defined in the module",
            id="a model no tool uses yet, built at load",
        ),
        pytest.param(
            "from pydantic import BaseModel\nfrom durable_agents import Agent\n\n"
            "class Found(BaseModel):\n    genre: Genra\n\n" + TAIL,
            "line 5 (`genre: Genra`): `Genra` is not defined in the module: import it, or "
            "correct its spelling (NameError: name 'Genra' is not defined",
            id="evaluated in the class body",
        ),
        pytest.param(
            "from __future__ import annotations\nfrom pydantic import BaseModel\n"
            "from durable_agents import Agent, tool\n\nclass Q(BaseModel):\n    q: str\n\n"
            "@tool\nasync def search(args: Q) -> Genra:\n    return 'x'\n\n" + TAIL,
            "line 9 (def search, `-> Genra`): `Genra` is not defined in the module",
            id="a tool's return annotation",
        ),
        pytest.param(
            "from durable_agents import Agent\nimport yaml_for_this_test\n" + TAIL,
            "line 2 (`import yaml_for_this_test`): ModuleNotFoundError: No module named "
            "'yaml_for_this_test': add the package that provides it: `scripts/add-package "
            "pyyaml-test` (into the Worker's python_modules/ and .venv; a running scripts/dev "
            "reloads the Worker)",
            id="a missing module and its package",
        ),
        pytest.param(
            "from durable_agents import Agent\nfrom not_a_module_anywhere import x\n" + TAIL,
            "ModuleNotFoundError: No module named 'not_a_module_anywhere': if "
            "`not_a_module_anywhere` comes from a package, add that package: "
            "`scripts/add-package <its name on PyPI>`; a module of your own goes in src/",
            id="a missing module of no known package",
        ),
        pytest.param(
            "from durable_agents import Agent\n\nX = 1 / 0\n" + TAIL,
            "line 3 (`X = 1 / 0`): ZeroDivisionError: division by zero",
            id="any exception at import",
        ),
        pytest.param(
            "from durable_agents import Agent\ndef make_deps(\n",
            "does not load: line 2: SyntaxError: '(' was never closed",
            id="a syntax error",
        ),
        pytest.param(
            "def make_deps(env, http):\n    return None\n",
            "must define AGENT, the Agent the Worker serves",
            id="a breach of the protocol",
        ),
    ],
)
def test_an_agent_module_that_does_not_load_names_the_file_the_line_and_the_fix(
    tmp_path: Path, source: str, says: str
) -> None:
    file = tmp_path / "loans_agent.py"
    file.write_text(source)
    message = failure(file, packages={"yaml_for_this_test": "pyyaml-test"})
    assert message.startswith(str(file)), message
    assert says in message, message


class _Absent(importlib.abc.MetaPathFinder):
    """Imports of `name` fail as they do where its package is not installed."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == self.name or fullname.startswith(f"{self.name}."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


def test_emailstr_without_email_validator_names_the_extra_pydantic_asks_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a project that has not added it yet, whether or not this .venv has it.
    monkeypatch.setattr(sys, "meta_path", [_Absent("email_validator"), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "email_validator", raising=False)
    file = tmp_path / "agent.py"
    file.write_text(
        "from pydantic import BaseModel, EmailStr\nfrom durable_agents import Agent\n\n"
        "class Reminder(BaseModel):\n    to: EmailStr\n\n" + TAIL
    )
    assert failure(file) == (
        f"{file} does not load: line 4 (`class Reminder(BaseModel):`): ModuleNotFoundError: "
        "No module named 'email_validator': add the package that provides it: "
        "`scripts/add-package 'pydantic[email]'` (into the Worker's python_modules/ and "
        ".venv; a running scripts/dev reloads the Worker)"
    )


def _importer(file: Path) -> Any:
    def load() -> Any:
        spec = importlib.util.spec_from_file_location("agent", file)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


def test_under_the_dev_server_the_worker_serves_a_stand_in_and_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "agent.py").write_text("import yaml_for_this_test\n" + TAIL)
    note = types.ModuleType(DEV_SERVER_NOTE)
    note.AGENT_FILE = "/home/me/project/src/agent.py"  # type: ignore[attr-defined]
    note.PACKAGES = {"yaml_for_this_test": "pyyaml"}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, DEV_SERVER_NOTE, note)
    served, message = serve_agent(_importer(tmp_path / "agent.py"), str(tmp_path / "entry.py"))
    assert served.agent.name == "agent-not-loaded"
    assert message is not None
    assert message.startswith(
        "/home/me/project/src/agent.py does not load: line 1 (`import yaml_for_this_test`): "
        "ModuleNotFoundError: No module named 'yaml_for_this_test': add the package that "
        "provides it: `scripts/add-package pyyaml`"
    )
    assert capsys.readouterr().out == (
        f"{message}. Until it loads, the Worker answers every request with this error\n"
    )


def test_deployed_the_worker_fails_at_start_with_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "agent.py").write_text("import yaml_for_this_test\n" + TAIL)
    monkeypatch.delitem(sys.modules, DEV_SERVER_NOTE, raising=False)
    with pytest.raises(ConfigurationError, match=r"^src/agent.py does not load: line 1 ") as raised:
        serve_agent(_importer(tmp_path / "agent.py"), str(tmp_path / "entry.py"))
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)
    (tmp_path / "agent.py").write_text(TAIL)
    served, message = serve_agent(_importer(tmp_path / "agent.py"), str(tmp_path / "entry.py"))
    assert (served.agent.name, message) == ("a", None)


def test_the_dev_servers_note_is_the_module_the_worker_reads(tmp_path: Path) -> None:
    assert dev.DEV_SERVER_NOTE == agent_module.DEV_SERVER_NOTE
    text = dev.dev_server_note(tmp_path / "my_agent.py", {"yaml": "pyyaml"}, {"anyio": "anyio/**"})
    names: dict[str, Any] = {}
    exec(compile(text, "note", "exec"), names)
    assert names["AGENT_FILE"] == str(tmp_path / "my_agent.py")
    assert names["PACKAGES"] == {"yaml": "pyyaml"}
    assert names["EXCLUDED"] == {"anyio": "anyio/**"}


def test_a_module_the_configs_exclude_leaves_out_is_named_with_that_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # wrangler.toml's [python_modules] exclude: whole packages and modules, not globs.
    patterns = ["**/*.pyc", "anyio/**", "pydantic/color.py", "idna-*.dist-info/**", "h11/**"]
    excluded = agent_checks.excluded_modules(patterns)
    assert excluded == {"anyio": "anyio/**", "pydantic.color": "pydantic/color.py",
                        "h11": "h11/**"}  # fmt: skip
    # On CPython, at start: an import of one is warned of with the entry to delete.
    (tmp_path / "agent.py").write_text("import anyio\nimport h11.events\n")
    vendored = tmp_path / "python_modules"
    for name in ("anyio", "h11"):
        (vendored / name).mkdir(parents=True)
    missing = agent_checks.modules_the_worker_lacks(
        {"agent": tmp_path / "agent.py"}, vendored, lambda names: {"anyio": "anyio"}, excluded
    )
    assert [(m.module, m.excluded) for m in missing] == [("anyio", "anyio/**"), ("h11", "h11/**")]
    assert missing[0].describe() == (
        f"{tmp_path / 'agent.py'}, line 1, imports `anyio`, which python_modules/ has but "
        "wrangler.toml's [python_modules] exclude leaves out of the Worker ('anyio/**'): "
        "delete that entry"
    )
    # In the Worker (the dev server's note read by serve_agent): the error says the same.
    (tmp_path / "agent.py").write_text("import pydantic.color_for_this_test\n" + TAIL)
    note = types.ModuleType(DEV_SERVER_NOTE)
    note.EXCLUDED = {"pydantic.color_for_this_test": "pydantic/color_for_this_test.py"}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, DEV_SERVER_NOTE, note)
    served, message = serve_agent(_importer(tmp_path / "agent.py"), str(tmp_path / "entry.py"))
    assert served.agent.name == "agent-not-loaded"
    assert message is not None
    assert message.endswith(
        "ModuleNotFoundError: No module named 'pydantic.color_for_this_test': python_modules/ "
        "has it, but wrangler.toml's [python_modules] exclude leaves it out of the Worker "
        "('pydantic/color_for_this_test.py'): delete that entry"
    ), message


AGENT_IMPORTS = """\
from __future__ import annotations
import json, os.path
from typing import TYPE_CHECKING
import helpers
from pydantic import BaseModel
import yaml
if TYPE_CHECKING:
    import only_for_types
try:
    import optional_speedup
except ImportError:
    optional_speedup = None

def later():
    from dateutil import parser
    import js
"""


def test_the_imports_python_modules_lacks_are_found_with_their_package(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT_IMPORTS)
    (tmp_path / "helpers.py").write_text("import annotationlib\n")
    vendored = tmp_path / "python_modules"
    (vendored / "pydantic").mkdir(parents=True)
    (vendored / "pydantic-2.14.4.dist-info").mkdir()
    asked: list[set[str]] = []

    def packages(names: Iterable[str]) -> Mapping[str, str]:
        asked.append(set(names))
        return {"yaml": "pyyaml"}

    modules = {"agent": tmp_path / "agent.py", "helpers": tmp_path / "helpers.py",
               "durable_agents.x": tmp_path / "agent.py"}  # fmt: skip
    missing = agent_checks.modules_the_worker_lacks(modules, vendored, packages)
    assert [(m.module, m.line, m.package) for m in missing] == [
        ("yaml", 6, "pyyaml"),
        ("dateutil", 15, None),
    ]
    assert asked == [{"yaml", "dateutil"}]
    assert missing[0].describe() == (
        f"{tmp_path / 'agent.py'}, line 6, imports `yaml`, which the Worker's packages "
        "(python_modules/) lack: add it with `scripts/add-package pyyaml`"
    )
    (tmp_path / "agent.py").write_text("import json\nfrom pydantic import BaseModel\n")
    assert agent_checks.modules_the_worker_lacks(modules, vendored, packages) == []
    assert len(asked) == 1  # .venv's packages are read only when a module is missing
    assert agent_checks.modules_the_worker_lacks(modules, tmp_path / "none", packages) == []


def test_the_dev_server_warns_of_a_missing_module_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "agent.py").write_text("import yaml\n")
    (tmp_path / "python_modules" / "pydantic").mkdir(parents=True)
    monkeypatch.setattr(dev, "PYTHON_MODULES", tmp_path / "python_modules")
    rescans: list[int] = []
    monkeypatch.setattr(dev, "packages_providing", lambda: rescans.append(1) or {})
    check = dev.packages_check(lambda: {"yaml": "pyyaml", "pydantic": "pydantic"})
    modules = {"agent": tmp_path / "agent.py"}
    # What the Worker's note gets: .venv's packages python_modules/ has not.
    assert check(modules, {}) == {"yaml": "pyyaml"}
    assert check(modules, {}) == {"yaml": "pyyaml"}
    out = capsys.readouterr().out
    assert out.count("dev: warning: ") == 1
    assert "imports `yaml`, which the Worker's packages (python_modules/) lack: add it with " in out
    assert "`scripts/add-package pyyaml`. Until then the Worker answers every request" in out
    (tmp_path / "python_modules" / "yaml").mkdir()
    assert check(modules, {}) == {}
    assert capsys.readouterr().out == ""
    assert rescans == []  # .venv is read again only for a module none of its packages has
    (tmp_path / "agent.py").write_text("import mystery\n")
    check(modules, {})
    assert rescans == [1]
    assert "imports `mystery`, which the Worker's packages" in capsys.readouterr().out


def test_venv_packages_are_read_from_their_dist_info(tmp_path: Path) -> None:
    site = tmp_path / "lib" / "site-packages"
    (site / "PyYAML-6.0.3.dist-info").mkdir(parents=True)
    (site / "PyYAML-6.0.3.dist-info" / "top_level.txt").write_text("_yaml\nyaml\n")
    (site / "email_validator-2.3.0.dist-info").mkdir()
    (site / "email_validator-2.3.0.dist-info" / "RECORD").write_text(
        "email_validator/__init__.py,sha256=x,1\n../../bin/email_validator,,\n"
        "email_validator-2.3.0.dist-info/RECORD,,\n"
    )
    assert agent_checks.packages_providing([str(site)]) == {
        "_yaml": "pyyaml",
        "yaml": "pyyaml",
        "email_validator": "email-validator",
    }
