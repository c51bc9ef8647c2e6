// Check that migrations/ applies to D1 with wrangler, offline, and that the local runtime shares its data.
//
//   node scripts/check_d1_migrations.mjs
//
// In a scratch project (wrangler.toml + a copy of migrations/): runs
// `wrangler d1 migrations apply --local`, then starts the local runtime on
// the same persisted database and writes a session through `d1_store`,
// then reads it back with `wrangler d1 execute --local`. Exits non-zero,
// saying what failed, if any step does. Run by tests/cloudflare/test_wrangler_migrations.py.

import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startRuntime } from "../runtime/index.mjs";

const projectDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const scratch = mkdtempSync(path.join(tmpdir(), "d1-migrations-"));
const databaseId = "00000000-0000-4000-8000-00000000d1d1";
const wrangler = path.join(projectDir, "node_modules", ".bin", "wrangler");

function run(args) {
  return execFileSync(wrangler, args, {
    cwd: scratch,
    encoding: "utf8",
    env: { ...process.env, CI: "true", WRANGLER_SEND_METRICS: "false" },
    stdio: ["ignore", "pipe", "pipe"],
  });
}

try {
  cpSync(path.join(projectDir, "migrations"), path.join(scratch, "migrations"), { recursive: true });
  symlinkSync(path.join(projectDir, "node_modules"), path.join(scratch, "node_modules"));
  writeFileSync(path.join(scratch, "worker.js"), "export default { fetch() { return new Response('ok'); } };\n");
  writeFileSync(
    path.join(scratch, "wrangler.toml"),
    `name = "d1-migrations-check"
main = "worker.js"
compatibility_date = "2026-04-01"

[[d1_databases]]
binding = "DB"
database_name = "durable-agents"
database_id = "${databaseId}"
migrations_dir = "migrations"
`,
  );

  const applied = run(["d1", "migrations", "apply", "durable-agents", "--local"]);
  if (!/commands executed successfully/.test(applied)) throw new Error(`wrangler did not apply the migrations:\n${applied}`);
  console.log("wrangler d1 migrations apply --local: ok");

  const runtime = await startRuntime({ projectDir, persist: path.join(scratch, ".wrangler", "state"), d1DatabaseId: databaseId });
  try {
    await runtime.pyodide.runPythonAsync(`
from workers import env
from durable_agents.cloudflare import d1_store
from durable_agents.messages import Message

names = {name for (name,) in await env.DB.prepare(
    "SELECT name FROM sqlite_master WHERE name LIKE 'agent_%'").raw()}
expected = {"agent_sessions", "agent_messages", "agent_leases", "agent_approvals", "agent_approvals_one_decision", "agent_messages_one_result_per_call",
            "agent_messages_one_turn_per_request_key", "agent_sessions_by_update",
            "agent_messages_append_only_in_order"}
assert names == expected, f"the migrated schema differs: {sorted(names)}"
store = d1_store(env.DB)
await store.append_messages_atomic("migrated", 0, [Message.user("written by the runtime")])
try:
    await store.append_messages_atomic("migrated", 3, [Message.user("gap")])
    raise AssertionError("the in-order trigger did not fire on the migrated schema")
except Exception as exc:
    assert type(exc).__name__ == "SessionConflictError", repr(exc)
`);
  } finally {
    await runtime.close();
  }
  console.log("local runtime on the migrated database: ok");

  const read = JSON.parse(run(["d1", "execute", "durable-agents", "--local", "--json", "--command", "SELECT content FROM agent_messages WHERE session_id = 'migrated'"]));
  const contents = read[0].results.map((row) => row.content);
  if (JSON.stringify(contents) !== JSON.stringify(["written by the runtime"])) throw new Error(`wrangler read back ${JSON.stringify(contents)}`);
  console.log("wrangler d1 execute --local sees the runtime's rows: ok");
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
