"""runtime/storage.mjs (a Durable Object's ctx.storage) on its own, in Node: no Pyodide.

The Python side (the SDK's wrappers, over HTTP) is tested by
tests/cloudflare/test_other_workers.py; this checks the API shape against
workerd's: cursor methods and counters, transactionSync, the KV API's options.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import { DurableObjectStorage, storageFile } from "./runtime/storage.mjs";
const file = storageFile(process.argv[1], "worker-Class", "ab".repeat(32));
const out = {};
const storage = new DurableObjectStorage(file);
const sql = storage.sql;
out.className = [storage, sql, sql.exec("SELECT 1")].map((o) => o.constructor.name);
sql.exec("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, data BLOB); CREATE INDEX i ON t(id)");
const two = ["a", new Uint8Array([1, 2]), "b", null];
out.insert = sql.exec("INSERT INTO t (name, data) VALUES (?, ?), (?, ?)", ...two).rowsWritten;
const cursor = sql.exec("SELECT id, name FROM t ORDER BY id");
out.columns = cursor.columnNames;
out.iterated = [...cursor];
out.rowsRead = cursor.rowsRead;
out.raw = [...sql.exec("SELECT name, id FROM t ORDER BY id").raw()];
const blob = sql.exec("SELECT data FROM t WHERE name = 'a'").one().data;
out.blob = [blob.constructor.name, [...new Uint8Array(blob)]];
for (const query of ["SELECT 1 WHERE 0", "SELECT 1 UNION ALL SELECT 2"]) {
  try { sql.exec(query).one(); } catch (error) { (out.oneErrors ??= []).push(error.message); }
}
try { sql.exec("SELEC nonsense"); } catch (error) { out.syntax = error.message; }
try {
  storage.transactionSync(() => { sql.exec("DELETE FROM t"); throw new Error("boom"); });
} catch (error) { out.txError = error.message; }
out.afterRollback = sql.exec("SELECT count(*) AS n FROM t").one().n;
out.txResult = storage.transactionSync(() => 42);
out.size = sql.databaseSize > 0;
await storage.put({ "k:1": { a: [1, 2] }, "k:2": "two", "k:3": 3, other: true });
out.get = await storage.get("k:1");
out.missing = (await storage.get("nope")) === undefined;
out.getMany = Object.fromEntries(await storage.get(["k:2", "nope", "k:3"]));
out.listPrefix = [...(await storage.list({ prefix: "k:" })).keys()];
out.listRange = [...(await storage.list({ start: "k:2", end: "other" })).keys()];
out.listAfter = [...(await storage.list({ startAfter: "k:1", limit: 1 })).keys()];
out.listReverse = [...(await storage.list({ reverse: true, limit: 2 })).keys()];
out.deleteOne = await storage.delete("k:1");
out.deleteMany = await storage.delete(["k:2", "k:3", "nope"]);
out.remaining = [...(await storage.list()).keys()];
storage.close();
const reopened = new DurableObjectStorage(file);
const count = reopened.sql.exec("SELECT count(*) AS n FROM t").one().n;
out.persisted = [count, await reopened.get("other")];
reopened.close();
console.log(JSON.stringify(out));
"""


def test_storage_api(tmp_path: Path) -> None:
    result = subprocess.run(
        ["node", "--input-type=module", "-e", SCRIPT, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(result.stdout)
    assert out["className"] == ["DurableObjectStorage", "SqlStorage", "SqlStorageCursor"]
    assert out["insert"] == 2
    assert out["columns"] == ["id", "name"]
    assert out["iterated"] == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    assert out["rowsRead"] == 2
    assert out["raw"] == [["a", 1], ["b", 2]]
    assert out["blob"] == ["ArrayBuffer", [1, 2]]
    assert out["oneErrors"] == [
        "Expected exactly one result from SQL query, but got no results.",
        "Expected exactly one result from SQL query, but got multiple results.",
    ]
    assert "SQLITE_ERROR" in out["syntax"]
    assert out["txError"] == "boom"
    assert out["afterRollback"] == 2
    assert out["txResult"] == 42
    assert out["size"] is True
    assert out["get"] == {"a": [1, 2]}
    assert out["missing"] is True
    assert out["getMany"] == {"k:2": "two", "k:3": 3}
    assert out["listPrefix"] == ["k:1", "k:2", "k:3"]
    assert out["listRange"] == ["k:2", "k:3"]
    assert out["listAfter"] == ["k:2"]
    assert out["listReverse"] == ["other", "k:3"]
    assert out["deleteOne"] is True
    assert out["deleteMany"] == 2
    assert out["remaining"] == ["other"]
    assert out["persisted"] == [2, True]
    assert (tmp_path / "worker-Class" / f"{'ab' * 32}.sqlite").exists()
