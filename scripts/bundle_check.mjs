// Run the Worker from its deploy bundle alone: the output of
// `npx wrangler deploy --dry-run --outdir DIR`, inside the local runtime.
//
//   node scripts/bundle_check.mjs DIR [--config wrangler.toml] [--vars JSON]
//                                     [--durable-objects JSON] [--starts N]
//
// Copies the bundle into a scratch project (the bundle's Worker modules as
// its src/, its python_modules/, and the runtime's per-event glue), so
// Python's import path holds nothing else of this repository; starts the
// runtime on it (D1 in memory), times `import entry`, creates the tables,
// serves one turn (`POST /sessions/bundle-check/messages`) and prints ONE
// line of JSON: {importEntryMs, loadPyodideMs, importWorkersMs, starts: [...],
// status, body, modules}. `modules` are the modules Python loaded from the
// scratch project (the bundle). `--starts N` starts the runtime N times on the
// same scratch project: the first start compiles the bundle's .pyc files,
// later ones reuse them (as `scripts/dev` does from its second start on).
// The vars `--vars` gives (JSON object) are the Worker's env; every value
// "{{echo}}" is replaced by the URL of a local server answering 200 {} to
// anything, for the tools' requests.

import { cpSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startRuntime } from "../runtime/index.mjs";

const PROJECT_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

function option(name, fallback) {
  const index = process.argv.indexOf(name);
  return index >= 0 ? process.argv[index + 1] : fallback;
}

const bundle = path.resolve(process.argv[2] ?? "");
const vars = JSON.parse(option("--vars", "{}"));
const durableObjects = JSON.parse(option("--durable-objects", '{"SESSIONS": "AgentSession"}'));
const starts = Number(option("--starts", "1"));

const scratch = mkdtempSync(path.join(os.tmpdir(), "bundle-check-"));
const echo = http.createServer((request, response) => {
  request.resume();
  request.on("end", () => response.writeHead(200, { "content-type": "application/json" }).end("{}"));
});

// The tables (as `wrangler d1 migrations apply` makes them: the Worker never does), then
// one turn through the Worker; what it answered and the modules Python loaded from the bundle.
async function serveOneTurn(runtime, env, durableObjects) {
  await runtime.pyodide.runPythonAsync(`
import workers
from durable_agents.cloudflare import d1_store
await d1_store(workers.env.DB).create_tables()
`);
  const worker = runtime.loadWorker({ main: "entry", durableObjects });
  const response = await worker.fetch(
    new Request("http://bundle.check/sessions/bundle-check/messages", {
      method: "POST",
      headers: { authorization: `Bearer ${env.API_TOKEN}`, "content-type": "application/json" },
      body: JSON.stringify({ message: "triage issue 42" }),
    }),
  );
  const body = await response.json();
  await runtime.drain();
  const loaded = runtime.pyodide.runPython(`
import json, sys
json.dumps(sorted(
    name for name, m in list(sys.modules.items())
    if (getattr(m, "__file__", None) or "").startswith("/project/")
))`);
  return { status: response.status, body, modules: JSON.parse(loaded) };
}

async function main() {
  for (const entry of readdirSync(bundle)) {
    if (entry === "README.md") continue; // wrangler's note about the folder, not uploaded
    const to = entry === "python_modules" ? entry : path.join("src", entry);
    cpSync(path.join(bundle, entry), path.join(scratch, to), { recursive: true });
  }
  cpSync(path.join(PROJECT_DIR, "runtime", "_workers_harness.py"), path.join(scratch, "runtime", "_workers_harness.py"));
  // The runtime reads the compatibility date and flags (which Pyodide) from it.
  cpSync(path.resolve(option("--config", path.join(PROJECT_DIR, "wrangler.toml"))), path.join(scratch, "wrangler.toml"));
  await new Promise((resolve) => echo.listen(0, "127.0.0.1", resolve));
  const echoUrl = `http://127.0.0.1:${echo.address().port}`;
  const env = Object.fromEntries(Object.entries(vars).map(([k, v]) => [k, v === "{{echo}}" ? echoUrl : v]));

  const timings = [];
  let result;
  for (let start = 1; start <= starts; start++) {
    const runtime = await startRuntime({ projectDir: scratch, persist: false, vars: env, log: () => {} });
    try {
      const t0 = performance.now();
      runtime.importPython("entry").destroy();
      const importEntryMs = Math.round(performance.now() - t0);
      timings.push({ ...runtime.timings, importEntryMs });
      if (start === starts) result = await serveOneTurn(runtime, env, durableObjects);
    } finally {
      await runtime.close();
    }
  }
  const last = timings.at(-1);
  process.stdout.write(
    JSON.stringify({
      importEntryMs: last.importEntryMs,
      loadPyodideMs: last.loadPyodideMs,
      importWorkersMs: last.importWorkersMs,
      starts: timings.map((t) => t.importEntryMs),
      ...result,
    }) + "\n",
  );
}

try {
  await main();
} catch (error) {
  // Only the message: Node would print the source line of Pyodide's one-line bundle.
  process.stderr.write(`bundle_check: ${error?.message ?? error}\n`);
  process.exitCode = 1;
} finally {
  echo.close();
  rmSync(scratch, { recursive: true, force: true });
}
