// `ctx.storage` of a SQLite-backed Durable Object, as workerd shapes it, on a real SQLite.
//
// workerd's API (src/workerd/api/actor-state.h, sql.h; Cloudflare's docs for
// DurableObjectStorage, SqlStorage, SqlStorageCursor):
// - `storage.sql.exec(query, ...bindings)` runs NOW, synchronously, and returns
//   a cursor: `toArray()`, `one()` (exactly one row, else an Error), `raw()`
//   (rows as arrays), iteration / `next()`, `columnNames`, `rowsRead`,
//   `rowsWritten`; `storage.sql.databaseSize`;
// - `storage.transactionSync(fn)`: fn's writes commit together, or roll back if it throws;
// - the KV API, asynchronous: `get(key | keys)`, `put(key, value | entries)`,
//   `delete(key | keys)`, `list({prefix, start, startAfter, end, limit, reverse})`,
//   `deleteAll()`; values are structured-cloned (V8 serialization, as workerd
//   stores them), kept in the same database (workerd's `_cf_KV` table).
// The classes carry workerd's names: the workers SDK picks its Python wrappers by
// constructor name (`DurableObjectStorage` -> `_BindingWrapper`).
//
// Why better-sqlite3: sql.exec and transactionSync are synchronous on workerd,
// and Python calls them synchronously. Node 20 has no JSPI, so Pyodide cannot
// wait for an asynchronous engine (miniflare's workerd, over HTTP) inside a
// synchronous call; an in-process synchronous SQLite can answer at once.
// better-sqlite3 12 is that (13 crashes on Node 20); one file per object under
// `<persist>/v3/do/<worker name>-<class name>/<id>.sqlite` (miniflare's
// layout; in memory without persistence).

import { mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import v8 from "node:v8";

const require = createRequire(import.meta.url);
let Database = null;

function openDatabase(file) {
  Database ??= require("better-sqlite3");
  if (file !== ":memory:") mkdirSync(path.dirname(file), { recursive: true });
  const db = new Database(file);
  db.pragma("journal_mode = WAL");
  // A commit is durable when it returns: WAL with synchronous=FULL fsyncs the WAL on
  // every COMMIT (the output gate below waits for that commit).
  db.pragma("synchronous = FULL");
  db.exec("CREATE TABLE IF NOT EXISTS _cf_KV (key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID");
  return db;
}

// A bound value as SQLite takes it (workerd takes strings, numbers, null, ArrayBuffer views).
function toSqlValue(value) {
  if (value === undefined) return null;
  if (typeof value === "boolean") return value ? 1 : 0;
  if (value instanceof ArrayBuffer) return Buffer.from(value);
  if (ArrayBuffer.isView(value)) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  return value;
}

// A column value as workerd returns it: blobs as ArrayBuffer.
function fromSqlValue(value) {
  if (Buffer.isBuffer(value)) return value.buffer.slice(value.byteOffset, value.byteOffset + value.byteLength);
  return value;
}

export class SqlStorageCursor {
  #rows;
  #index = 0;

  constructor(columnNames, rows, rowsRead, rowsWritten) {
    this.columnNames = columnNames;
    this.#rows = rows;
    this.rowsRead = rowsRead;
    this.rowsWritten = rowsWritten;
  }

  #object(row) {
    return Object.fromEntries(this.columnNames.map((name, i) => [name, fromSqlValue(row[i])]));
  }

  next() {
    if (this.#index >= this.#rows.length) return { done: true, value: undefined };
    return { done: false, value: this.#object(this.#rows[this.#index++]) };
  }

  [Symbol.iterator]() {
    return this;
  }

  toArray() {
    const rest = this.#rows.slice(this.#index).map((row) => this.#object(row));
    this.#index = this.#rows.length;
    return rest;
  }

  one() {
    const rest = this.#rows.length - this.#index;
    if (rest === 0) throw new Error("Expected exactly one result from SQL query, but got no results.");
    if (rest > 1) throw new Error("Expected exactly one result from SQL query, but got multiple results.");
    return this.next().value;
  }

  raw() {
    const rows = this.#rows.slice(this.#index).map((row) => row.map(fromSqlValue));
    this.#index = this.#rows.length;
    return rows[Symbol.iterator]();
  }
}

export class SqlStorage {
  #db;
  #willWrite;

  constructor(db, willWrite) {
    this.#db = db;
    this.#willWrite = willWrite;
  }

  exec(query, ...bindings) {
    const db = this.#db();
    let statement;
    try {
      statement = db.prepare(query);
    } catch (error) {
      // Several statements: workerd runs them all (bindings go to the last); here only without bindings.
      if (/more than one statement/.test(error.message) && bindings.length === 0) {
        this.#willWrite();
        const before = db.prepare("SELECT total_changes() AS n").get().n;
        db.exec(query);
        return new SqlStorageCursor([], [], 0, db.prepare("SELECT total_changes() AS n").get().n - before);
      }
      throw new Error(`${error.message}: SQLITE_ERROR`);
    }
    const values = bindings.map(toSqlValue);
    if (!statement.readonly) this.#willWrite();
    if (statement.reader) {
      const columns = statement.columns().map((column) => column.name);
      const rows = statement.raw(true).all(...values);
      const written = /^\s*(insert|update|delete|replace)\b/i.test(query) ? rows.length : 0;
      return new SqlStorageCursor(columns, rows, rows.length, written);
    }
    const info = statement.run(...values);
    return new SqlStorageCursor([], [], 0, info.changes);
  }

  get databaseSize() {
    const db = this.#db();
    return db.pragma("page_count", { simple: true }) * db.pragma("page_size", { simple: true });
  }
}

// Harness only (the output gate's tests): with DURABLE_AGENTS_RUNTIME_TEST_HOOKS=1 in the
// runtime's environment, `ctx.storage.failNextCommitForTests(message)` makes the next
// implicit commit fail, as a storage failure on workerd would.
const TEST_HOOKS = process.env.DURABLE_AGENTS_RUNTIME_TEST_HOOKS === "1";
// With the hooks on, DURABLE_AGENTS_RUNTIME_COMMIT_DELAY_MS=N delays each implicit
// commit by N ms (a slow disk), so a test can tell a held message from a fast commit.
const COMMIT_DELAY_MS = TEST_HOOKS ? Number(process.env.DURABLE_AGENTS_RUNTIME_COMMIT_DELAY_MS ?? 0) : 0;
// For the benchmark only: DURABLE_AGENTS_RUNTIME_OUTPUT_GATE=off commits each write
// on its own when it runs (SQLite autocommit) and holds nothing (no output gate).
const OUTPUT_GATE = process.env.DURABLE_AGENTS_RUNTIME_OUTPUT_GATE !== "off";

export class DurableObjectStorage {
  #file;
  #db = null;
  // The implicit transaction's durability: null when nothing is pending, else
  // {promise, resolve, reject}; settled when the commit returns (or fails).
  #pending = null;
  #failNext = null;
  #onFailure;

  /**
   * @param {string} file the object's SQLite file, or ":memory:"
   * @param {object} [options]
   * @param {(error: Error) => void} [options.onFailure] a commit failed (the object must be reset)
   */
  constructor(file, { onFailure } = {}) {
    this.#file = file;
    this.#onFailure = onFailure;
    this.sql = new SqlStorage(() => this.#open(), () => this.#willWrite());
    if (TEST_HOOKS) {
      this.failNextCommitForTests = (message = "injected storage failure") => {
        this.#failNext = String(message);
      };
    }
  }

  #open() {
    this.#db ??= openDatabase(this.#file);
    return this.#db;
  }

  // Every write joins one implicit transaction, as on workerd (writes between
  // awaits are coalesced and committed together); it commits at the next
  // macrotask boundary (setImmediate), and until that commit has returned
  // (fsynced: WAL, synchronous=FULL) the writes are pending: the output gate
  // holds the object's outgoing messages on `pendingDurability()`.
  #willWrite() {
    const db = this.#open();
    if (this.#pending !== null || !OUTPUT_GATE) return;
    if (!db.inTransaction) db.exec("BEGIN");
    let resolve;
    let reject;
    const promise = new Promise((yes, no) => {
      resolve = yes;
      reject = no;
    });
    promise.catch(() => undefined); // observed by the gate, when anyone waits
    this.#pending = { promise, resolve, reject };
    if (COMMIT_DELAY_MS > 0) setTimeout(() => this.#commit(), COMMIT_DELAY_MS);
    else setImmediate(() => this.#commit());
  }

  #commit() {
    const pending = this.#pending;
    if (pending === null) return;
    this.#pending = null;
    const db = this.#db;
    try {
      if (this.#failNext !== null) {
        const message = this.#failNext;
        this.#failNext = null;
        throw new Error(`${message}: SQLITE_IOERR`);
      }
      if (db?.inTransaction) db.exec("COMMIT");
      pending.resolve();
    } catch (error) {
      // workerd: the writes are lost and the object is reset; here they are rolled back.
      try {
        if (db?.inTransaction) db.exec("ROLLBACK");
      } catch {
        // already rolled back by SQLite
      }
      const failure = new Error(`Durable Object storage write failed; the object was reset: ${error.message}`);
      pending.reject(failure);
      this.#onFailure?.(failure);
    }
  }

  /** The output gate: null if no write is pending, else a promise settled when they are durable. */
  pendingDurability() {
    return this.#pending?.promise ?? null;
  }

  transactionSync(callback) {
    const db = this.#open();
    this.#willWrite();
    return db.transaction(() => callback())();
  }

  // --- the KV API (asynchronous, as on workerd) ---

  async get(keys) {
    const db = this.#open();
    const read = db.prepare("SELECT value FROM _cf_KV WHERE key = ?");
    if (Array.isArray(keys)) {
      const found = new Map();
      for (const key of keys) {
        const row = read.get(String(key));
        if (row) found.set(String(key), v8.deserialize(row.value));
      }
      return found;
    }
    const row = read.get(String(keys));
    return row ? v8.deserialize(row.value) : undefined;
  }

  async put(keyOrEntries, value) {
    const db = this.#open();
    this.#willWrite();
    const write = db.prepare("INSERT OR REPLACE INTO _cf_KV (key, value) VALUES (?, ?)");
    if (typeof keyOrEntries === "object" && keyOrEntries !== null) {
      const entries = keyOrEntries instanceof Map ? [...keyOrEntries] : Object.entries(keyOrEntries);
      db.transaction(() => entries.forEach(([key, v]) => write.run(String(key), v8.serialize(v))))();
      return;
    }
    if (value === undefined) throw new TypeError("put() needs a value (undefined cannot be stored)");
    write.run(String(keyOrEntries), v8.serialize(value));
  }

  async delete(keys) {
    const db = this.#open();
    this.#willWrite();
    const remove = db.prepare("DELETE FROM _cf_KV WHERE key = ?");
    if (Array.isArray(keys)) {
      return db.transaction(() => keys.reduce((n, key) => n + remove.run(String(key)).changes, 0))();
    }
    return remove.run(String(keys)).changes > 0;
  }

  async list(options = {}) {
    const db = this.#open();
    const where = [];
    const params = [];
    if (options.prefix !== undefined) {
      where.push("substr(key, 1, ?) = ?");
      params.push(String(options.prefix).length, String(options.prefix));
    }
    if (options.start !== undefined) where.push("key >= ?") && params.push(String(options.start));
    if (options.startAfter !== undefined) where.push("key > ?") && params.push(String(options.startAfter));
    if (options.end !== undefined) where.push("key < ?") && params.push(String(options.end));
    let sql = "SELECT key, value FROM _cf_KV";
    if (where.length) sql += ` WHERE ${where.join(" AND ")}`;
    sql += ` ORDER BY key ${options.reverse ? "DESC" : "ASC"}`;
    if (options.limit !== undefined) sql += ` LIMIT ${Math.max(0, Math.floor(Number(options.limit)))}`;
    return new Map(db.prepare(sql).all(...params).map((row) => [row.key, v8.deserialize(row.value)]));
  }

  async deleteAll() {
    const db = this.#open();
    this.#willWrite();
    db.exec("DELETE FROM _cf_KV");
  }

  /** Resolves when every write so far is durable (workerd's `sync()`). */
  async sync() {
    await this.pendingDurability();
  }

  async getAlarm() {
    throw new Error("Durable Object alarms are not served by the local runtime");
  }

  async setAlarm() {
    throw new Error("Durable Object alarms are not served by the local runtime");
  }

  async deleteAlarm() {
    throw new Error("Durable Object alarms are not served by the local runtime");
  }

  /** Harness only: close the database file. */
  close() {
    this.#commit();
    this.#db?.close();
    this.#db = null;
  }
}

/** The file of one object's storage: miniflare's layout, or ":memory:" without persistence. */
export function storageFile(storageRoot, uniqueKey, id) {
  return storageRoot ? path.join(storageRoot, uniqueKey, `${id}.sqlite`) : ":memory:";
}
