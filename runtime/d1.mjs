// D1 for the local runtime: miniflare's real D1 engine, reached in one round trip per call.
//
// miniflare runs workerd with a real D1 binding, but the proxy that
// `mf.getD1Database()` returns costs several proxy round trips per call
// (~48 ms per batch from Python) and its constructor is not named
// `D1Database`, so the workers SDK would not wrap it. Instead a tiny bridge
// Worker inside miniflare holds the real binding; the `D1Database` and
// `D1PreparedStatement` classes below (named exactly as workerd's, which is
// how the SDK's `_EnvWrapper` recognises them) send each statement call or
// whole `batch()` to it as ONE JSON request. Errors come back with D1's own
// message (`D1_ERROR: ...`) and are rethrown as JS Errors, which Python sees
// as `pyodide.ffi.JsException`, as on Cloudflare.

import { Miniflare } from "miniflare";

// The bridge Worker. Statements arrive as {sql, params}; BLOB params travel
// as {$blob: base64} because JSON has no bytes.
const BRIDGE_SCRIPT = `
function decodeParam(value) {
  if (value !== null && typeof value === "object" && typeof value.$blob === "string") {
    return Uint8Array.from(atob(value.$blob), (c) => c.charCodeAt(0));
  }
  return value;
}
function statement(db, s) {
  return db.prepare(s.sql).bind(...s.params.map(decodeParam));
}
// Drops every table, view, index and trigger except D1's own, so each test
// starts from an empty database without restarting miniflare.
async function reset(db) {
  const { results } = await db
    .prepare("SELECT type, name FROM sqlite_master WHERE name NOT LIKE '_cf_%' AND name NOT LIKE 'sqlite_%' AND type IN ('table', 'view')")
    .all();
  if (results.length === 0) return { dropped: 0 };
  await db.batch(results.map((r) => db.prepare("DROP " + r.type.toUpperCase() + " IF EXISTS \\"" + r.name.replaceAll('"', '""') + "\\"")));
  return { dropped: results.length };
}
export default {
  async fetch(request, env) {
    const call = await request.json();
    const db = env[call.binding];
    try {
      let value;
      switch (call.op) {
        case "batch": value = await db.batch(call.statements.map((s) => statement(db, s))); break;
        case "exec": value = await db.exec(call.sql); break;
        case "reset": value = await reset(db); break;
        case "first": value = await statement(db, call.statements[0]).first(call.column ?? undefined); break;
        case "raw": value = await statement(db, call.statements[0]).raw(call.options ?? undefined); break;
        case "all": case "run": value = await statement(db, call.statements[0])[call.op](); break;
        default: throw new Error("unknown bridge op " + call.op);
      }
      return Response.json({ ok: true, value: value === undefined ? null : value });
    } catch (error) {
      return Response.json({ ok: false, error: { name: error.name, message: error.message, cause: error.cause?.message ?? null } });
    }
  },
};
`;

function encodeParam(value) {
  if (value === undefined) {
    // What workerd's D1 says for `undefined` (e.g. a raw proxy's `bind(None)`).
    throw new TypeError("D1_TYPE_ERROR: Type 'undefined' not supported for value 'undefined'");
  }
  if (value instanceof ArrayBuffer || ArrayBuffer.isView(value)) {
    const bytes = value instanceof ArrayBuffer ? new Uint8Array(value) : new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
    return { $blob: Buffer.from(bytes).toString("base64") };
  }
  if (typeof value === "bigint") {
    if (value > BigInt(Number.MAX_SAFE_INTEGER) || value < BigInt(Number.MIN_SAFE_INTEGER)) {
      throw new RangeError(`D1_TYPE_ERROR: integer ${value} does not fit a JavaScript number`);
    }
    return Number(value);
  }
  return value;
}

/** One miniflare instance holding every D1 database of the runtime, plus the bridge to it. */
export class D1Bridge {
  /**
   * @param {object} options
   * @param {Record<string, string>} options.databases binding name -> database_id
   * @param {string | false} options.persistDir where D1 data lives (wrangler's `.wrangler/state/v3/d1`), or false for memory
   */
  static async start({ databases, persistDir, kvNamespaces = {}, kvPersistDir = false }) {
    const mf = new Miniflare({
      name: "durable-agents-d1-bridge",
      modules: true,
      script: BRIDGE_SCRIPT,
      compatibilityDate: "2026-04-01",
      d1Databases: databases,
      d1Persist: persistDir,
      // KV namespaces (binding -> id) are served by the same miniflare (runtime/kv.mjs).
      kvNamespaces,
      kvPersist: kvPersistDir,
    });
    const url = await mf.ready;
    return new D1Bridge(mf, String(url));
  }

  constructor(miniflare, url) {
    this.miniflare = miniflare;
    this.url = url;
  }

  async call(request) {
    const response = await fetch(this.url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(request),
    });
    const reply = await response.json();
    if (reply.ok) return reply.value;
    const error = new Error(reply.error.message);
    if (reply.error.cause) error.cause = new Error(reply.error.cause);
    throw error;
  }

  /** The binding object a Worker's `env` holds for this database. */
  database(binding) {
    return new D1Database(this, binding);
  }

  async dispose() {
    await this.miniflare.dispose();
  }
}

// The class names are load-bearing: the SDK picks its D1 wrapper by
// `constructor.name`. Fields are private so Python sees only D1's methods.
export class D1Database {
  #bridge;
  #binding;

  constructor(bridge, binding) {
    this.#bridge = bridge;
    this.#binding = binding;
  }

  prepare(sql) {
    return new D1PreparedStatement(this.#bridge, this.#binding, String(sql), []);
  }

  async batch(statements) {
    const list = Array.from(statements, (s) => {
      if (!(s instanceof D1PreparedStatement)) throw new TypeError("D1_TYPE_ERROR: batch() takes prepared statements");
      return s.toJSON();
    });
    return this.#bridge.call({ binding: this.#binding, op: "batch", statements: list });
  }

  async exec(sql) {
    return this.#bridge.call({ binding: this.#binding, op: "exec", sql: String(sql) });
  }

  // Sessions (read replication) are a no-op locally: one primary.
  withSession() {
    return this;
  }

  /** Harness only: empty the database (drop every user table). Not a D1 API. */
  async resetForTests() {
    return this.#bridge.call({ binding: this.#binding, op: "reset" });
  }
}

export class D1PreparedStatement {
  #bridge;
  #binding;
  #sql;
  #params;

  constructor(bridge, binding, sql, params) {
    this.#bridge = bridge;
    this.#binding = binding;
    this.#sql = sql;
    this.#params = params;
  }

  bind(...values) {
    return new D1PreparedStatement(this.#bridge, this.#binding, this.#sql, values.map(encodeParam));
  }

  toJSON() {
    return { sql: this.#sql, params: this.#params };
  }

  #call(op, extra = {}) {
    return this.#bridge.call({ binding: this.#binding, op, statements: [this.toJSON()], ...extra });
  }

  run() {
    return this.#call("run");
  }

  all() {
    return this.#call("all");
  }

  first(column) {
    return this.#call("first", { column: column ?? null });
  }

  raw(options) {
    return this.#call("raw", { options: options ? { columnNames: Boolean(options.columnNames) } : null });
  }
}
