"""Other people's Python Workers under the dev server (issue 10, items 3 and 4).

Each Worker under tests/workers/<name>/ is written for these tests in the shape
of one of Cloudflare's python-workers-examples (hello, D1, Durable Objects with
ctx.storage, KV and R2, cron, FastAPI without jinja2), each with its own config
(wrangler.toml, .json, .jsonc), and is served unmodified by `runtime/dev.py
--config <its config>` (what `scripts/dev --config` runs: `wrangler dev` on real
workerd), then tested over HTTP. The servers start in parallel, once per module.
A test Worker gets the kit's python_modules/ (the Workers SDK) by a symlink
(`served_worker.link_python_modules`); the FastAPI one vendors its own.

Needs `scripts/setup-runtime` (node_modules/, the pinned Node and python_modules/).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.served_worker import ServedWorker, link_python_modules, runtime_module, wrangler

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "tests" / "workers"
CONFIGS = {
    "hello": "wrangler.toml",
    "d1": "wrangler.jsonc",
    "durable_objects": "wrangler.json",
    "kv": "wrangler.jsonc",
    "cron": "wrangler.toml",
}
# The FastAPI Worker vendors its own packages, as `pywrangler sync` would: this kit's
# python_modules/ plus these pure-Python wheels (fastapi 0.135: later ones need
# opentelemetry-api), fetched from PyPI once into .cache/.
FASTAPI_WHEELS = ["fastapi==0.135.0", "starlette==1.10.0", "annotated-doc==0.0.7"]
WHEEL_CACHE = ROOT / ".cache" / "test-wheels"


def fastapi_project(directory: Path) -> Path:
    """A copy of tests/workers/fastapi with its own python_modules/; its config."""
    wheels = {w.split("==")[0].replace("-", "_"): w for w in FASTAPI_WHEELS}
    cached = {p.name.split("-")[0].lower(): p for p in WHEEL_CACHE.glob("*.whl")}
    if set(wheels) - set(cached):
        fetched = subprocess.run(
            [
                *[str(ROOT / ".venv" / "bin" / "python"), "-m", "pip", "download", "-q"],
                *["--no-deps", "--only-binary=:all:", "-d", str(WHEEL_CACHE), *FASTAPI_WHEELS],
            ],
            capture_output=True,
            text=True,
        )
        if fetched.returncode != 0:
            pytest.fail(f"cannot fetch {FASTAPI_WHEELS} from PyPI: {fetched.stderr[-500:]}")
        cached = {p.name.split("-")[0].lower(): p for p in WHEEL_CACHE.glob("*.whl")}
    project = directory / "fastapi"
    shutil.copytree(WORKERS / "fastapi", project, ignore=shutil.ignore_patterns("python_modules"))
    shutil.copytree(ROOT / "python_modules", project / "python_modules")
    for name, pin in wheels.items():
        assert cached[name].name.startswith(f"{name}-{pin.split('==')[1]}-"), cached[name]
        with zipfile.ZipFile(cached[name]) as wheel:
            wheel.extractall(project / "python_modules")
    return project / "wrangler.jsonc"


class Served(ServedWorker):
    """One test Worker served (`served_worker.ServedWorker`), read over HTTP."""

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.origin + path, timeout=60) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def get_json(self, path: str) -> object:
        status, body = self.get(path)
        assert status == 200, body
        return json.loads(body)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    state = tmp_path_factory.mktemp("other-workers")
    served = {
        name: Served(WORKERS / name / config, state / name) for name, config in CONFIGS.items()
    }
    served["fastapi"] = Served(fastapi_project(state), state / "fastapi-state")
    try:
        for server in served.values():
            server.start()
        for server in served.values():
            server.wait_ready(240)  # six at once on a small machine
        yield served
    finally:
        for server in served.values():
            server.kill()


def start_and_fail(config: Path, tmp_path: Path, env: dict[str, str] | None = None) -> Served:
    server = Served(config, tmp_path / "state", {**os.environ, **(env or {})})
    server.start()
    try:
        assert server.wait_exit() != 0, server.output
    finally:
        server.kill()
    assert not server.origin, server.output  # never said it was ready
    return server


# --- hello: wrangler.toml, main and .dev.vars relative to the config ---


def test_hello_is_served_from_its_own_directory(workers: dict[str, Served]) -> None:
    hello = workers["hello"]
    assert hello.get("/") == (200, "Hello, world!")  # [vars] and a module beside main
    assert hello.get("/secret") == (200, "swordfish")  # its own .dev.vars
    assert hello.get("/nope")[0] == 404
    assert "dev: hello-python (tests/workers/hello/wrangler.toml) on workerd" in hello.output[:500]
    path = hello.get_json("/path")
    assert isinstance(path, list)
    # wrangler bundled main's folder and the python_modules/ beside the config (the kit's,
    # linked): workerd puts both on the path, the bundle's folder last.
    assert path[-2:] == ["/session/metadata/python_modules", "/session/metadata"]
    assert (WORKERS / "hello" / "python_modules").resolve() == ROOT / "python_modules"
    # wrangler's request log, passed through.
    assert hello.wait_line(r"^GET /nope 404 Not Found \(\d+ms\)$")


# --- D1 from a wrangler.jsonc, no migrations/ folder ---


def test_d1_without_migrations_folder(workers: dict[str, Served]) -> None:
    d1 = workers["d1"]
    assert not (WORKERS / "d1" / "migrations").exists()
    assert "D1 migrations: up to date" in d1.output
    assert d1.get("/add?author=Ada&text=Hello") == (201, "added")
    assert d1.get("/add?author=Alan&text=Hi") == (201, "added")
    expected = [{"author": "Ada", "text": "Hello"}, {"author": "Alan", "text": "Hi"}]
    assert d1.get_json("/quotes") == expected
    # In the persist folder, where `wrangler d1 ... --local` reads it (as a user would).
    out = wrangler(
        *["d1", "execute", "quotes", "--local", "--json", "--config", str(d1.config)],
        *["--persist-to", str(d1.state), "--command", "SELECT author, text FROM quotes"],
    )
    assert json.loads(out)[0]["results"] == expected
    assert list((d1.state / "v3" / "d1").glob("*/*.sqlite"))


# --- Durable Objects with ctx.storage (wrangler.json) ---


def test_durable_object_kv_storage(workers: dict[str, Served]) -> None:
    do = workers["durable_objects"]
    assert do.get_json("/groceries/add/milk") == {"count": 1}
    assert do.get_json("/groceries/add/eggs") == {"count": 2}
    assert do.get("/groceries/show") == (200, "milk\neggs")
    assert do.get("/other/show") == (200, "No notes")  # another object, other storage
    assert do.get_json("/groceries/keys") == {"keys": ["note:001", "note:002"], "deleted": False}


def test_durable_object_sql_storage_and_transaction_sync(workers: dict[str, Served]) -> None:
    do = workers["durable_objects"]
    assert do.get_json("/counter/a/bump") == {"n": 1}
    assert do.get_json("/counter/a/bump") == {"n": 2}
    assert do.get_json("/counter/b/bump") == {"n": 1}
    # Both writes of a transactionSync whose callback raises are rolled back.
    assert do.get("/counter/a/bump-twice-then-fail") == (200, "failed: True")
    report = do.get_json("/counter/a")
    assert report == {
        "rows": [{"name": "a", "n": 2}],
        "columns": ["name", "n"],
        "rowsRead": 1,
        "rowsWritten": 1,
        "all": [{"name": "a"}],  # object b's rows are in its own database
    }


def test_durable_object_storage_persists_across_a_restart(workers: dict[str, Served]) -> None:
    do = workers["durable_objects"]
    assert do.get_json("/counter/p/bump") == {"n": 1}
    assert do.get_json("/journal/add/first") == {"count": 1}
    files = list((do.state / "v3" / "do" / "notes-do-Counter").glob("*.sqlite"))
    assert files, "one SQLite file per object under <persist>/v3/do/<worker>-<class>/"
    do.kill()  # SIGKILL: wrangler and workerd go with it
    do.start_ready()
    assert do.get_json("/counter/p/bump") == {"n": 2}
    assert do.get("/journal/show") == (200, "first")


# --- KV and R2 from a JSONC config with comments and trailing commas ---


def test_kv_namespace(workers: dict[str, Served]) -> None:
    kv = workers["kv"]
    assert kv.get("/get/colour") == (200, "(none)")
    assert kv.get("/put/colour/blue") == (200, "stored")
    assert kv.get("/get/colour") == (200, "blue")
    assert kv.get_json("/list") == ["colour"]
    assert list((kv.state / "v3" / "kv").glob("*/*.sqlite"))


def test_jsonc_comments_and_trailing_commas(workers: dict[str, Served]) -> None:
    # "//" and "/* */" in strings are no comments; an escaped quote ends no string; a
    # string's ", }" is no trailing comma.
    served = workers["kv"].get_json("/vars")
    assert served == {
        "URL_WITH_SLASHES": "https://example.com/a//b",
        "NOT_A_COMMENT": "/* not a comment */",
        "QUOTED": '"//"',
        "COMMA_BRACE": "x, }",
        "COMMA_BRACKET": "[a, ]",
        "BACKSLASH": "C:\\",
    }
    # The dev server reads the file as wrangler (which gave the Worker its vars) does.
    wrangler_config = runtime_module("wrangler_config")
    assert wrangler_config.jsonc((WORKERS / "kv" / "wrangler.jsonc").read_text())["vars"] == served


def test_r2_bucket_is_served_locally(workers: dict[str, Served]) -> None:
    kv = workers["kv"]
    assert kv.get("/bucket/get/report.txt") == (200, "(none)")
    assert kv.get_json("/bucket/put/report.txt/all-well") == {"key": "report.txt", "size": 8}
    assert kv.get("/bucket/get/report.txt") == (200, "all-well")
    assert (kv.state / "v3" / "r2").is_dir()


# --- cron: [triggers] crons, GET /cdn-cgi/handler/scheduled?cron=... ---


def test_cron_scheduled_event(workers: dict[str, Served]) -> None:
    cron = workers["cron"]
    scheduled = "/cdn-cgi/handler/scheduled"
    assert cron.get(f"{scheduled}?cron=*/5+*+*+*+*&time=1700000000000") == (200, "ok")
    assert cron.get(f"{scheduled}?cron=0+3+*+*+mon") == (200, "ok")
    assert cron.get(f"{scheduled}?cron=fail") == (500, "exception")  # scheduled() raised
    cron.wait_line(r"RuntimeError: the scheduled handler failed")
    runs = cron.get_json("/")
    assert isinstance(runs, list)
    assert runs[0] == {"cron": "*/5 * * * *", "scheduledTime": 1700000000000}
    assert runs[1]["cron"] == "0 3 * * mon"
    assert abs(runs[1]["scheduledTime"] / 1000 - time.time()) < 60
    assert [run["cron"] for run in runs] == ["*/5 * * * *", "0 3 * * mon", "fail"]
    # For a Python Worker, /__scheduled is no trigger: the Worker's fetch() answers it.
    assert cron.get_json("/__scheduled?cron=x") == runs


# --- FastAPI through the SDK's ASGI adapter, on the project's own python_modules/ ---


def test_fastapi_app(workers: dict[str, Served]) -> None:
    api = workers["fastapi"]
    assert not (api.config.parent / "python_modules").is_symlink()  # its own, not the kit's
    assert api.get_json("/") == {"message": "FastAPI on a Python Worker"}
    assert api.get_json("/square/7") == {"number": 7, "square": 49}
    status, body = api.get("/square/seven")
    assert status == 422
    assert json.loads(body)["detail"][0]["type"] == "int_parsing"
    assert api.get_json("/motto") == {"motto": "typed all the way down"}  # scope["env"]
    request = urllib.request.Request(
        api.origin + "/items",
        data=json.dumps({"name": "pen", "quantity": 3}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read()) == {"created": "pen", "quantity": 3}


# --- configs wrangler and workerd refuse ---


def write_worker(directory: Path, config_name: str, config: str) -> Path:
    (directory / "src").mkdir(parents=True)
    (directory / "src" / "entry.py").write_text(
        "from workers import Response, WorkerEntrypoint\n\n\n"
        "class Default(WorkerEntrypoint):\n"
        "    async def fetch(self, request):\n"
        "        return Response('hi')\n"
    )
    (directory / config_name).write_text(config)
    link_python_modules(directory)
    return directory / config_name


def test_a_compatibility_date_the_offline_pyodide_cannot_run_is_refused(tmp_path: Path) -> None:
    # Offline, workerd runs the development bundle (Pyodide 314.0.6), which needs a
    # recent compatibility date (workerd stops at start below 2026-08-04): the dev
    # server refuses an older one before starting, saying why.
    config = write_worker(
        tmp_path / "old",
        "wrangler.jsonc",
        '{"name": "old", "main": "src/entry.py", "compatibility_date": "2025-06-01",\n'
        ' "compatibility_flags": ["python_workers"]}',
    )
    server = start_and_fail(config, tmp_path, {"PYODIDE_BUNDLE": "development"})
    assert "compatibility_date 2025-06-01: offline, workerd runs the Pyodide 314.0.6" in (
        server.output
    )
    assert "needs a date from 2026-08-04" in server.output
    assert "PYODIDE_BUNDLE=official" in server.output


def test_an_unknown_compatibility_flag_is_refused(tmp_path: Path) -> None:
    config = write_worker(
        tmp_path / "flag",
        "wrangler.toml",
        'name = "flag"\nmain = "src/entry.py"\ncompatibility_date = "2026-10-01"\n'
        'compatibility_flags = ["python_workers", "no_such_flag"]\n',
    )
    server = start_and_fail(config, tmp_path)
    assert "No such compatibility flag: no_such_flag" in server.output


def test_main_is_resolved_against_the_config_not_this_repo(tmp_path: Path) -> None:
    # The kit has src/entry.py; a config elsewhere whose main does not exist is refused.
    assert (ROOT / "src" / "entry.py").is_file()
    directory = tmp_path / "elsewhere"
    directory.mkdir()
    config = directory / "wrangler.toml"
    config.write_text(
        'name = "x"\nmain = "src/entry.py"\ncompatibility_date = "2026-10-01"\n'
        'compatibility_flags = ["python_workers"]\n'
    )
    server = start_and_fail(config, tmp_path)
    assert 'The entry-point file at "src/entry.py" was not found' in server.output
