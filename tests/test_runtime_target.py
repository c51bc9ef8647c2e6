"""The runtime the project targets, and workerd's rules in the local runtime (runtime/).

- Which Python and Pyodide the config selects: `pywrangler`'s own reader, and
  runtime/compat.mjs (workerd's flag rules and release map) against the npm
  Pyodide that package.json pins; a config selecting another Pyodide is refused.
- workerd's rules, checked on a fresh runtime running a throwaway Worker
  (written under .tmp/ in the repo, git-ignored): entropy and the clock at top
  level, `sys.path`, `.pth` processing, `_cloudflare_compat_flags`,
  `_pyodide_entrypoint_helper`, Durable Object ids; and over a real
  `scripts/dev` process, that a Worker calling `random.random()` at import does
  not start and the output names the cause.

The in-request side of some rules is also tested inside the runtime, in
tests/runtime/test_workerd_rules.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PROJECT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node")
CONFIG = tomllib.loads((PROJECT / "wrangler.toml").read_text())


def require_runtime() -> None:
    """scripts/test sets the runtime up first; without it these tests fail, never skip."""
    assert NODE is not None, "node is not on PATH"
    assert (PROJECT / "node_modules" / "pyodide").is_dir(), (
        "the local runtime is not set up: run scripts/setup-runtime"
    )


@pytest.fixture
def needs_runtime_fixture() -> None:
    require_runtime()


needs_runtime = pytest.mark.usefixtures("needs_runtime_fixture")


def node_eval(script: str, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run an ES module script with Node in the project directory."""
    assert NODE is not None
    return subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def compat(date: str, flags: list[str]) -> dict[str, Any]:
    script = f"""
import {{ compileCompatibility }} from "./runtime/compat.mjs";
const result = compileCompatibility({json.dumps(date)}, {json.dumps(flags)});
process.stdout.write(JSON.stringify(result));
"""
    done = node_eval(script)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# --- item 1: the runtime the config targets ---


def test_pywrangler_reads_the_config_as_python_314() -> None:
    # pywrangler (PyPI workers-py) decides which wheels `pywrangler sync/deploy`
    # vendors from the project's wrangler config, found from the working directory.
    done = subprocess.run(
        [sys.executable, "-c", "from pywrangler.utils import get_python_version as v; print(v())"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3.14"


def test_the_config_targets_python_workers_314() -> None:
    assert CONFIG["compatibility_flags"][0] == "python_workers"
    assert CONFIG["compatibility_date"] >= "2026-09-08"


@needs_runtime
def test_the_config_selects_the_pyodide_the_runtime_runs() -> None:
    result = compat(CONFIG["compatibility_date"], CONFIG["compatibility_flags"])
    assert result["errors"] == []
    assert result["python"] == {
        "field": "pythonWorkers314",
        "flag": "python_workers_314",
        "pyodide": "314.0.6",
    }
    assert result["module"]["python_workers_314"] is True
    installed = json.loads((PROJECT / "node_modules" / "pyodide" / "package.json").read_text())
    pinned = json.loads((PROJECT / "package.json").read_text())["devDependencies"]["pyodide"]
    assert installed["version"] == pinned == "314.0.6"


@needs_runtime
@pytest.mark.parametrize(
    ("date", "flags", "pyodide"),
    [
        # workerd's map (build/python_metadata.bzl) and its flags' implications
        ("2024-06-01", ["python_workers"], "0.26.0a2"),
        ("2025-09-29", ["python_workers"], "0.28.2"),
        ("2026-06-10", ["python_workers", "python_workers_20260610"], "314.0.4"),
        ("2026-09-07", ["python_workers"], "0.28.2"),
        ("2026-09-08", ["python_workers"], "314.0.6"),
        ("2026-06-10", ["python_workers", "python_workers_314"], "314.0.6"),
        ("2026-09-08", ["python_workers", "no_python_workers_314"], "0.28.2"),
        ("2026-11-30", ["python_workers", "no_python_workers_20250116"], "314.0.6"),
    ],
)
def test_workerd_selects_pyodide_by_date_and_flags(
    date: str, flags: list[str], pyodide: str
) -> None:
    result = compat(date, flags)
    assert result["errors"] == []
    assert result["python"]["pyodide"] == pyodide


@needs_runtime
def test_compat_flags_compile_as_workerd_compiles_them() -> None:
    result = compat("2026-09-08", ["python_workers", "nodejs_compat"])
    module = result["module"]
    assert module["python_process_pth_files"] is True  # by date, 2026-05-26
    assert module["python_request_headers_preserve_commas"] is True  # by date, 2026-02-17
    assert module["python_workflows_implicit_dependencies"] is True  # implied after 2026-02-25
    assert module["python_dedicated_snapshot"] is True  # implied by an implied flag
    assert module["python_shared_standard_library"] is False  # implied only from 2026-11-19
    assert module["python_workers_20260610"] is False
    assert module["experimental"] is False
    assert module["nodejs_compat"] is True
    assert len(module) > 190
    assert all(isinstance(value, bool) for value in module.values())
    refused = compat("2026-09-08", ["python_workers", "no_such_flag", "python_workers"])
    assert refused["errors"] == [
        "Compatibility flag specified multiple times: python_workers",
        "No such compatibility flag: no_such_flag",
    ]
    contradictory = compat("2026-09-08", ["python_workers", "nodejs_compat", "no_nodejs_compat"])
    assert any("mutually contradictory" in error for error in contradictory["errors"])
    assert compat("2026-13-01", ["python_workers"])["errors"] == [
        "Invalid compatibility date: 2026-13-01"
    ]


@needs_runtime
def test_the_runtime_refuses_a_config_that_selects_another_pyodide() -> None:
    script = """
import { startRuntime } from "./runtime/index.mjs";
try {
  await startRuntime({ compatibilityDate: "2026-06-10",
                       compatibilityFlags: ["python_workers", "python_workers_20260610"] });
  console.log("started");
} catch (error) {
  console.log(error.message);
}
"""
    done = node_eval(script)
    assert done.returncode == 0, done.stderr
    assert "select Pyodide 314.0.4 on workerd (python_workers_20260610)" in done.stdout
    assert "the local runtime has Pyodide 314.0.6" in done.stdout
    assert "started" not in done.stdout


def test_the_flag_table_comes_from_workerd() -> None:
    table = json.loads((PROJECT / "runtime" / "workerd-compat.json").read_text())
    assert table["generatedBy"] == "scripts/workerd_compat.py"
    assert any("compatibility-date.capnp" in source for source in table["sources"])
    flags = {flag["field"]: flag for flag in table["flags"]}
    assert flags["pythonWorkers314"]["impliedBy"] == [
        {"names": ["pythonWorkers"], "date": "2026-09-08"}
    ]
    assert flags["pythonProcessPthFiles"]["date"] == "2026-05-26"
    assert table["pythonReleases"]["pythonWorkers314"] == "314.0.6"
    ordinals = [flag["ordinal"] for flag in table["flags"]]
    assert ordinals == sorted(set(ordinals))


# --- item 2: workerd's rules, on a fresh runtime with a throwaway Worker ---

PROBE_WORKER = '''
"""A Worker that records what its top level and a request can do."""
import importlib.util
import json
import os
import sys
import time

import random
import _cloudflare_compat_flags as flags
import _pyodide_entrypoint_helper as helper
from workers import DurableObject, Response, WorkerEntrypoint


def attempt(fn):
    try:
        return {"value": repr(fn())}
    except BaseException as error:
        return {"error": f"{type(error).__name__}: {error}", "errno": getattr(error, "errno", None)}


def allowed_urandom():
    from _cloudflare.allow_entropy import allow_bad_entropy_calls

    with allow_bad_entropy_calls(1):
        return os.urandom(4)


import uuid
import secrets
import anyio.to_thread

CAPTURED_RANDINT = random.randint
TOP = {
    "random": attempt(random.random),
    "randint": attempt(lambda: random.randint(1, 6)),
    "seeded_random": attempt(lambda: random.Random(7).random()),
    "unseeded_random": attempt(random.Random),
    "urandom": attempt(lambda: os.urandom(4)),
    "uuid4": attempt(uuid.uuid4),
    "secrets": attempt(lambda: secrets.token_hex(4)),
    "system_random": attempt(lambda: random.SystemRandom().random()),
    "allowed_urandom": attempt(allowed_urandom),
    "time": [time.time(), time.time()],
    "sys_path": list(sys.path),
    "cwd": os.getcwd(),
    "hash_seed": os.environ.get("PYTHONHASHSEED"),
    "importable": {
        name: importlib.util.find_spec(name) is not None
        for name in [
            "probe_helper", "workers", "pydantic", "_cloudflare",
            "_workers_harness", "_runtime_tests", "_dev_agent", "_local_runtime",
            "runtime", "tests", "scripts", "durable_agents", "entry", "conftest",
        ]
    },
    "pth_loaded": "_workers_sdk_patch_loader" in sys.modules,
    "anyio_run_sync": anyio.to_thread.run_sync.__module__,
    "flags": {
        "type": type(flags).__name__,
        "python_workers": flags.python_workers,
        "python_workers_314": flags.python_workers_314,
        "python_workers_20260610": flags.python_workers_20260610,
        "python_process_pth_files": flags.python_process_pth_files,
        "unknown": attempt(lambda: flags.no_such_flag_anywhere),
    },
    "helper": {
        name: hasattr(helper, name)
        for name in [
            "doAnImport", "cloudflareWorkersModule", "cloudflareSocketsModule",
            "workerEntrypoint", "patchWaitUntil", "TEST_ONLY_THROW_PYTHON_WORKERS_INTERNAL_ERROR",
            "patch_env_helper",
        ]
    },
}


class Counter(DurableObject):
    async def fetch(self, request):
        return Response(self.ctx.id.toString())


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        import workers

        ns = self.env.COUNTER
        by_name = ns.idFromName("session-1")
        unique = ns.newUniqueId()
        stub_id = await (await ns.get(by_name).fetch("http://do/")).text()
        request_facts = {
            "random": attempt(random.random),
            "captured_randint": attempt(lambda: CAPTURED_RANDINT(1, 6)),
            "unseeded_random": attempt(lambda: random.Random().random()),
            "urandom": attempt(lambda: len(os.urandom(4))),
            "uuid4": attempt(lambda: str(uuid.uuid4())),
            "time": time.time(),
            "patch_env": attempt(lambda: workers.patch_env(X="1").__enter__()),
            "ids": {
                "by_name": by_name.toString(),
                "name": by_name.name,
                "stub": stub_id,
                "unique_valid": attempt(lambda: ns.idFromString(unique.toString()).toString()),
                "foreign": attempt(lambda: ns.idFromString("ab" * 32)),
                "malformed": attempt(lambda: ns.idFromString("xyz")),
            },
        }
        return Response(json.dumps({"top": TOP, "request": request_facts}))
'''

BAD_WORKER = """
import random

print("importing the bad Worker")
VALUE = random.random()
"""

PROBE_DRIVER = """
import { startRuntime } from "../../runtime/index.mjs";
const [workerDir] = process.argv.slice(2);
const runtime = await startRuntime({
  projectDir: process.cwd(), workerDir, workerName: "probe", d1Databases: {}, log: () => {},
});
let bad;
try {
  runtime.loadWorker({ main: "bad" });
  bad = { started: true };
} catch (error) {
  bad = { name: error.name, message: error.message, stack: error.stack };
}
const worker = runtime.loadWorker({ main: "probe", durableObjects: { COUNTER: "Counter" } });
const response = await worker.fetch(new Request("http://probe/"));
const facts = await response.json();
await runtime.close();
process.stdout.write(JSON.stringify({ bad, ...facts }) + "\\n");
process.exit(0);
"""


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """A git-ignored folder inside the repo (the runtime mounts only the project)."""
    folder = PROJECT / ".tmp" / f"runtime-target-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def probe(scratch: Path) -> dict[str, Any]:
    """What the throwaway Worker saw at top level and in its first request."""
    require_runtime()
    worker = scratch / "worker"
    worker.mkdir()
    (worker / "probe.py").write_text(PROBE_WORKER)
    (worker / "probe_helper.py").write_text("VALUE = 1\n")
    (worker / "bad.py").write_text(BAD_WORKER)
    driver = scratch / "driver.mjs"
    driver.write_text(PROBE_DRIVER)
    relative = worker.relative_to(PROJECT)
    done = subprocess.run(
        [NODE or "node", str(driver.relative_to(PROJECT)), str(relative)],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    facts["worker_dir"] = f"/project/{relative}"
    return facts


@pytest.mark.slow
def test_top_level_random_raises_workerds_error(probe: dict[str, Any]) -> None:
    top = probe["top"]
    refused = "RuntimeError: Cannot use random.random() outside of request context"
    assert top["random"]["error"] == refused
    assert top["randint"]["error"] == (
        "RuntimeError: Cannot use random.randint() outside of request context"
    )
    assert "value" in top["seeded_random"]  # Random(seed) needs no entropy
    assert top["unseeded_random"]["errno"] == 29


@pytest.mark.slow
def test_top_level_os_urandom_fails_with_errno_29(probe: dict[str, Any]) -> None:
    top = probe["top"]
    for name in ("urandom", "uuid4", "secrets", "system_random"):
        assert top[name]["errno"] == 29, (name, top[name])
        assert "Cannot get entropy outside of request context" in top[name]["error"]
    # What the SDK's patches use for imports that need a few calls: workerd's fixed bytes.
    assert top["allowed_urandom"]["value"] == repr(b"++++")


@pytest.mark.slow
def test_top_level_clock_is_frozen_and_small(probe: dict[str, Any]) -> None:
    first, second = probe["top"]["time"]
    assert first == second < 10
    assert probe["request"]["time"] > 1.7e9


@pytest.mark.slow
def test_entropy_and_random_work_inside_a_request(probe: dict[str, Any]) -> None:
    request = probe["request"]
    for name in ("random", "captured_randint", "unseeded_random", "urandom", "uuid4"):
        assert "value" in request[name], (name, request[name])


@pytest.mark.slow
def test_a_worker_using_random_at_import_does_not_start(probe: dict[str, Any]) -> None:
    bad = probe["bad"]
    assert bad["name"] == "WorkerStartError"
    assert "importing bad (its top level, outside any request" in bad["message"]
    assert "RuntimeError: Cannot use random.random() outside of request context" in bad["message"]
    relative = probe["worker_dir"].removeprefix("/project/")
    assert f"at {relative}/bad.py, line 5: VALUE = random.random()" in bad["message"]
    assert "Python traceback:" in bad["stack"]


@pytest.mark.slow
def test_sys_path_is_workerds_and_holds_only_the_workers_own_modules(
    probe: dict[str, Any],
) -> None:
    top = probe["top"]
    assert top["sys_path"] == [
        "/lib/python314.zip",
        "/lib/python3.14/lib-dynload",
        "/project/python_modules",
        "/lib/python3.14/site-packages",
        probe["worker_dir"],
    ]
    importable = top["importable"]
    assert {name for name, found in importable.items() if found} == {
        "probe_helper",
        "workers",
        "pydantic",
        "_cloudflare",
    }
    assert top["cwd"] == "/session"
    assert top["hash_seed"] == "111"


@pytest.mark.slow
def test_pth_files_in_python_modules_are_processed(probe: dict[str, Any]) -> None:
    top = probe["top"]
    assert top["pth_loaded"] is True
    # The SDK's package patch, registered by its .pth file, ran at the top-level import.
    assert top["anyio_run_sync"] == "_workers_sdk_package_patches"


@pytest.mark.slow
def test_compat_flags_module_is_workerds(probe: dict[str, Any]) -> None:
    flags = probe["top"]["flags"]
    assert flags["type"] == "JsProxy"
    assert flags["python_workers"] is True
    assert flags["python_workers_314"] is True
    assert flags["python_workers_20260610"] is False
    assert flags["python_process_pth_files"] is True
    assert flags["unknown"]["error"] == "AttributeError: no_such_flag_anywhere"


@pytest.mark.slow
def test_entrypoint_helper_has_workerds_members_only(probe: dict[str, Any]) -> None:
    helper = probe["top"]["helper"]
    assert helper.pop("patch_env_helper") is False
    assert all(helper.values()), helper
    assert probe["request"]["patch_env"]["error"] == "AttributeError: patch_env_helper"


FATAL_DRIVER = """
import { startRuntime } from "../../runtime/index.mjs";
const [workerDir] = process.argv.slice(2);
const runtime = await startRuntime({
  projectDir: process.cwd(), workerDir, d1Databases: {}, log: () => {}, stderr: () => {},
});
let outcome;
try {
  runtime.loadWorker({ main: "c_entropy" });
  outcome = { started: true };
} catch (error) {
  outcome = { name: error.name, message: error.message };
}
await runtime.close();
process.stdout.write(JSON.stringify(outcome) + "\\n");
process.exit(0);
"""


@pytest.mark.slow
@needs_runtime
def test_c_level_entropy_at_top_level_is_refused(scratch: Path) -> None:
    # _random.Random() seeds itself in C (getentropy), past the Python-level guards:
    # workerd refuses the call and the Worker does not start; so does the local runtime.
    worker = scratch / "c-entropy"
    worker.mkdir()
    (worker / "c_entropy.py").write_text("import _random\n\nGENERATOR = _random.Random()\n")
    driver = scratch / "fatal_driver.mjs"
    driver.write_text(FATAL_DRIVER)
    done = subprocess.run(
        [NODE or "node", str(driver.relative_to(PROJECT)), str(worker.relative_to(PROJECT))],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["name"] == "WorkerStartError"
    assert "Disallowed operation called within global scope" in outcome["message"]


def workerd_id(unique_key: str, name: str) -> str:
    """workerd's idFromName: HMAC-SHA256 with key SHA-256(unique key), then its MAC."""
    key = hashlib.sha256(unique_key.encode()).digest()
    first = hmac.new(key, name.encode(), "sha256").digest()[:16]
    return (first + hmac.new(key, first, "sha256").digest()[:16]).hex()


@pytest.mark.slow
def test_durable_object_ids_are_derived_as_workerd_derives_them(probe: dict[str, Any]) -> None:
    ids = probe["request"]["ids"]
    # `wrangler dev`'s unique key for a namespace: "<worker name>-<class name>".
    expected = workerd_id("probe-Counter", "session-1")
    assert ids["by_name"] == ids["stub"] == expected
    assert ids["name"] == "session-1"
    assert "value" in ids["unique_valid"]
    assert "Durable Object ID is not valid for this namespace." in ids["foreign"]["error"]
    assert "Invalid Durable Object ID: must be 64 hex digits" in ids["malformed"]["error"]


def test_workerd_id_matches_miniflares_derivation() -> None:
    # miniflare (what `wrangler dev` runs) derives the same ids from the same key.
    script = """
import { createHash, createHmac } from "node:crypto";
const key = createHash("sha256").update("durable-agents-AgentSession").digest();
const first = createHmac("sha256", key).update("first").digest().subarray(0, 16);
const mac = createHmac("sha256", key).update(first).digest().subarray(0, 16);
process.stdout.write(Buffer.concat([first, mac]).toString("hex"));
"""
    require_runtime()
    done = node_eval(script)
    assert done.stdout == workerd_id("durable-agents-AgentSession", "first")


# --- the acceptance point: over a real `scripts/dev` process ---


@pytest.mark.slow
@needs_runtime
def test_scripts_dev_refuses_a_worker_using_random_at_import_and_says_why(
    tmp_path: Path,
) -> None:
    # The dev server resolves `main` against the config's directory: a throwaway project.
    module = f"_tmp_random_at_import_{uuid.uuid4().hex[:8]}"
    (tmp_path / "src").mkdir()
    worker = tmp_path / "src" / f"{module}.py"
    worker.write_text(
        textwrap.dedent(
            """\
            from workers import Response, WorkerEntrypoint
            import random

            SECRET = random.random()


            class Default(WorkerEntrypoint):
                async def fetch(self, request):
                    return Response(str(SECRET))
            """
        )
    )
    config = tmp_path / "wrangler.toml"
    config.write_text(
        textwrap.dedent(
            f"""\
            name = "random-at-import"
            main = "src/{module}.py"
            compatibility_date = "{CONFIG["compatibility_date"]}"
            compatibility_flags = {json.dumps(CONFIG["compatibility_flags"])}
            """
        )
    )
    try:
        command = [str(PROJECT / "scripts" / "dev"), "--config", str(config), "--port", "0"]
        command += ["--persist-to", str(tmp_path / "state")]
        process = subprocess.Popen(
            command,
            cwd=PROJECT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "API_TOKEN": "t"},
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"scripts/dev did not exit; it printed:\n{output}")
    finally:
        worker.unlink(missing_ok=True)
    assert process.returncode != 0, output
    assert "ready on" not in output
    assert "RuntimeError: Cannot use random.random() outside of request context" in output
    assert f"at src/{module}.py, line 4: SECRET = random.random()" in output
