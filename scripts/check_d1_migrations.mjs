// Check that migrations/ applies to D1 with wrangler, offline, and that the local runtime shares its data.
//
//   node scripts/check_d1_migrations.mjs
//
// In a scratch project (wrangler.toml + a copy of migrations/): runs
// `wrangler d1 migrations apply --local` on every migration but the last,
// writes a session the old way, applies the last one (an upgrade, as a
// deployed database gets it) and checks what it did to the old rows; then
// starts the local runtime on the same persisted database and writes a
// session through `d1_store`, then reads it back with `wrangler d1 execute --local`. Exits non-zero,
// saying what failed, if any step does. Run by tests/cloudflare/test_wrangler_migrations.py.

import { execFileSync } from "node:child_process";
import { cpSync, mkdirSync, readdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
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
  const files = readdirSync(path.join(projectDir, "migrations")).filter((f) => f.endsWith(".sql")).sort();
  const last = files[files.length - 1];
  mkdirSync(path.join(scratch, "migrations"));
  for (const file of files.slice(0, -1)) cpSync(path.join(projectDir, "migrations", file), path.join(scratch, "migrations", file));
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

  const before = run(["d1", "migrations", "apply", "durable-agents", "--local"]);
  if (!/commands executed successfully/.test(before)) throw new Error(`wrangler did not apply the migrations before ${last}:\n${before}`);
  run(["d1", "execute", "durable-agents", "--local", "--command",
    "INSERT INTO agent_sessions VALUES ('old', 'bot', 'idle', 2, 1000, 2000); " +
    "INSERT INTO agent_messages (session_id, seq, role, content, input_tokens, output_tokens, created_at) " +
    "VALUES ('old', 0, 'user', 'q', NULL, NULL, 1000), ('old', 1, 'assistant', 'a', 12, 5, 2000)"]);
  cpSync(path.join(projectDir, "migrations", last), path.join(scratch, "migrations", last));
  const applied = run(["d1", "migrations", "apply", "durable-agents", "--local"]);
  if (!/commands executed successfully/.test(applied)) throw new Error(`wrangler did not apply ${last}:\n${applied}`);
  const old = JSON.parse(run(["d1", "execute", "durable-agents", "--local", "--json", "--command",
    "SELECT name, input_tokens, output_tokens FROM agent_sessions WHERE id = 'old'"]))[0].results;
  if (JSON.stringify(old) !== JSON.stringify([{ name: "old", input_tokens: 12, output_tokens: 5 }])) {
    throw new Error(`${last} did not name and sum the old session: ${JSON.stringify(old)}`);
  }
  console.log(`wrangler d1 migrations apply --local (${files.length - 1} migrations, then ${last} over old rows): ok`);

  const runtime = await startRuntime({ projectDir, persist: path.join(scratch, ".wrangler", "state"), d1DatabaseId: databaseId });
  try {
    await runtime.pyodide.runPythonAsync(`
from workers import env
from durable_agents.cloudflare import d1_store
from durable_agents.messages import Message, Usage

names = {name for (name,) in await env.DB.prepare(
    "SELECT name FROM sqlite_master WHERE name LIKE 'agent_%'").raw()}
expected = {"agent_sessions", "agent_messages", "agent_leases", "agent_approvals", "agent_approvals_one_decision", "agent_messages_one_result_per_call",
            "agent_messages_one_turn_per_request_key", "agent_sessions_by_update",
            "agent_sessions_by_creation", "agent_sessions_by_name",
            "agent_messages_append_only_in_order"}
assert names == expected, f"the migrated schema differs: {sorted(names)}"
store = d1_store(env.DB)
await store.create_tables()  # on the migrated database: adds nothing twice
await store.append_messages_atomic("migrated", 0, [Message.user("written by the runtime")], session_name="by-name")
await store.append_messages_atomic("migrated", 1, [Message.assistant("answer", usage=Usage(7, 3))])
found = await store.find_sessions("by-name")
assert [(i.id, i.input_tokens, i.output_tokens) for i in found] == [("migrated", 7, 3)], found
page = await store.list_sessions(limit=1)
assert [i.id for i in page.sessions] == ["migrated"] and page.next_cursor is not None, page
assert [i.id for i in (await store.list_sessions(cursor=page.next_cursor)).sessions] == ["old"]
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

  const read = JSON.parse(run(["d1", "execute", "durable-agents", "--local", "--json", "--command", "SELECT content FROM agent_messages WHERE session_id = 'migrated' ORDER BY seq"]));
  const contents = read[0].results.map((row) => row.content);
  if (JSON.stringify(contents) !== JSON.stringify(["written by the runtime", "answer"])) throw new Error(`wrangler read back ${JSON.stringify(contents)}`);
  console.log("wrangler d1 execute --local sees the runtime's rows: ok");
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
