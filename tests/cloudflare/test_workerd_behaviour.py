"""What real workerd does where the kit depends on it, asserted through a probe Worker.

tests/workers/probe/ is a Worker the kit's own tests never see (the plain `workers` SDK,
a D1 binding, a SQLite-backed Durable Object class, a cron, `[python_modules] exclude`),
served once for this module by runtime/dev.py (what `scripts/dev --config` runs: wrangler
dev on workerd). Each test states one behaviour as workerd has it, so the kit's code and
its CPython stand-ins (testing/fake_d1.py, test_do_store.py's storage) follow the engine,
and an upgrade that changes one fails here:

- scheduled() is called with three positional arguments, (controller, None, None): a
  handler of (self, controller) is a TypeError, and the bindings are `self.env`;
- `[python_modules] exclude` is honoured: `pydantic.v1` is not in the bundle;
- a Python int reaches D1 and Durable Object SQL as a JS Number only if
  |n| < 2**53 - 1 (2**53 - 1 itself is a BigInt): both refuse a BigInt;
- Durable Object SQL binds True as the text 'true'; BEGIN / SAVEPOINT / RELEASE are
  refused (transactionSync is the transaction); `PRAGMA journal_mode` and ATTACH are
  not authorised; of several statements in one exec, the last one's rows come back;
- the working directory at import is `/`.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.served_worker import ServedWorker

CONFIG = Path(__file__).resolve().parents[1] / "workers" / "probe" / "wrangler.toml"
MAX_NUMBER = 2**53 - 2  # the largest int Pyodide hands to JavaScript as a Number
BIGINT_ERROR = "JsException: TypeError: Cannot convert a BigInt value to a number"
TRANSACTION_ERROR = "please use the state.storage.transaction() or state.storage.transactionSync()"


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedWorker]:
    worker = ServedWorker(CONFIG, tmp_path_factory.mktemp("probe-state"))
    worker.start_ready()
    try:
        yield worker
    finally:
        worker.stop()


def _get(worker: ServedWorker, path: str, **query: Any) -> Any:
    url = worker.origin + path
    if query:
        url += "?" + urllib.parse.urlencode(query, doseq=True)
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read().decode()
    return json.loads(body) if response.headers.get_content_type() == "application/json" else body


def test_the_working_directory_at_import_is_the_root(probe: ServedWorker) -> None:
    assert _get(probe, "/cwd") == {"at_import": "/", "now": "/"}


def test_scheduled_is_called_with_controller_and_two_nones(probe: ServedWorker) -> None:
    before = len(_get(probe, "/scheduled"))
    assert _get(probe, "/cdn-cgi/handler/scheduled", cron="*/7 * * * *") == "ok"
    calls = _get(probe, "/scheduled")
    assert len(calls) == before + 1
    controller = {"tag": "[object ScheduledController]", "keys": ["cron", "scheduledTime"],
                  "in": ["cron"]}  # fmt: skip
    assert calls[-1] == {
        "positional": 3,  # so scheduled(self, controller) raises TypeError
        "keywords": [],
        "cron": "*/7 * * * *",
        "args": [controller, {"python": "NoneType"}, {"python": "NoneType"}],
    }


def test_python_modules_exclude_is_honoured(probe: ServedWorker) -> None:
    imports = _get(probe, "/imports")
    assert imports["pydantic"]["ok"] is True
    assert imports["pydantic"]["version"].startswith("2.")
    assert imports["pydantic.v1"] == {
        "ok": False,
        "error": "ModuleNotFoundError: No module named 'pydantic.v1'",
    }


@pytest.mark.parametrize("value", [MAX_NUMBER, -MAX_NUMBER, 2**31, 0])
def test_d1_binds_an_int_below_2_53_minus_1(probe: ServedWorker, value: int) -> None:
    # Bound as a JS number: D1 stores it as a REAL where the column has no type (the
    # kit's INTEGER columns convert it back), and it reads back as the same int.
    assert _get(probe, "/d1/bind", v=value) == {"ok": True, "rows": [[["int", str(value)], "real"]]}


@pytest.mark.parametrize("value", [2**53 - 1, -(2**53 - 1), 2**53, 2**63])
def test_d1_refuses_an_int_from_2_53_minus_1(probe: ServedWorker, value: int) -> None:
    assert _get(probe, "/d1/bind", v=value) == {
        "ok": False,
        "error": f"JsException: Error: D1_TYPE_ERROR: Type 'bigint' not supported for value "
        f"'{value}'",
    }


def test_d1_binds_a_bool_as_a_number_and_reads_big_ints_as_floats(probe: ServedWorker) -> None:
    assert _get(probe, "/d1/bind", v="true") == {"ok": True, "rows": [[["int", "1"], "real"]]}
    # What SQL itself makes beyond 2**53 - 1 comes back as a JS number: a rounded float.
    read = _get(probe, "/d1/sql", q=f"SELECT {2**53 + 1}, {2**53 - 1}")
    assert read == {"ok": True, "rows": [[["float", "9007199254740992.0"],
                                          ["int", "9007199254740991"]]]}  # fmt: skip


@pytest.mark.parametrize("via", ["js", "sdk"])
def test_durable_object_sql_binds_as_d1_does_but_true_as_text(
    probe: ServedWorker, via: str
) -> None:
    # via=js: ctx.storage's JS object, as the kit's store binds; via=sdk: the SDK's wrapper.
    for value in (MAX_NUMBER, -MAX_NUMBER):
        bound = _get(probe, "/do/bind", v=value, via=via)
        assert bound == {"ok": True, "rows": [[["int", str(value)], "real"]]}
    for value in (2**53 - 1, -(2**53 - 1), 2**53):
        assert _get(probe, "/do/bind", v=value, via=via) == {"ok": False, "error": BIGINT_ERROR}
    for flag in ("true", "false"):
        bound = _get(probe, "/do/bind", v=flag, via=via)
        assert bound == {"ok": True, "rows": [[["str", repr(flag)], "text"]]}


@pytest.mark.parametrize(
    "statement", ["BEGIN", "BEGIN TRANSACTION", "SAVEPOINT a", "RELEASE a", "COMMIT", "ROLLBACK"]
)
def test_durable_object_sql_refuses_transaction_statements(
    probe: ServedWorker, statement: str
) -> None:
    [result] = _get(probe, "/do/sql", q=statement)
    assert result["ok"] is False
    assert TRANSACTION_ERROR in result["error"], result


@pytest.mark.parametrize(
    "statement", ["PRAGMA journal_mode", "PRAGMA journal_mode = WAL", "ATTACH 'x.db' AS x"]
)
def test_durable_object_sql_refuses_journal_mode_and_attach(
    probe: ServedWorker, statement: str
) -> None:
    assert _get(probe, "/do/sql", q=statement) == [
        {"ok": False, "error": "JsException: Error: not authorized: SQLITE_AUTH"}
    ]


def test_durable_object_sql_runs_each_statement_but_returns_the_last(probe: ServedWorker) -> None:
    assert _get(probe, "/do/sql", q="SELECT 1; SELECT 2") == [{"ok": True, "rows": [[2]]}]
    script = (
        "CREATE TABLE IF NOT EXISTS m (x); DELETE FROM m; INSERT INTO m VALUES (5); SELECT x FROM m"
    )
    assert _get(probe, "/do/sql", q=script) == [{"ok": True, "rows": [[5]]}]


def test_durable_object_sql_has_what_the_kit_store_reads(probe: ServedWorker) -> None:
    # PRAGMA table_info (the schema check) and changes() after a statement of its own.
    queries = [
        "CREATE TABLE IF NOT EXISTS c (x INTEGER NOT NULL)",
        "INSERT INTO c VALUES (1), (2), (3)",
        "DELETE FROM c",
        "SELECT changes()",
        "PRAGMA table_info(c)",
        f"SELECT {2**53 + 1}, {2**53 - 1}",
    ]
    results = _get(probe, "/do/sql", q=queries)
    assert [r["ok"] for r in results] == [True] * 6, results
    assert results[3]["rows"] == [[3]]
    assert results[4]["rows"] == [[0, "x", "INTEGER", 1, None, 0]]
    assert results[5]["rows"] == [[9007199254740992.0, 9007199254740991]]  # rounded, as D1


def test_transaction_sync_rolls_back_on_an_exception(probe: ServedWorker) -> None:
    assert _get(probe, "/do/transaction") == {
        "fails": {"error": "ValueError: roll it back", "rows": []},
        "commits": {"returned": 7, "rows": [[2]]},
    }


def test_the_kv_table_is_listed_but_not_readable(probe: ServedWorker) -> None:
    master = _get(probe, "/do/master")
    assert master["kv_get"] == 1
    assert "_cf_KV" in master["names"]
    assert master["read_cf_kv"] == {
        "ok": False,
        "error": "JsException: Error: access to _cf_KV.key is prohibited: SQLITE_AUTH",
    }
