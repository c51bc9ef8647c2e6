// The process the pytest plugin starts: one local runtime, serving "run this test" requests.
//
//   node runtime/test-server.mjs [--project DIR]
//
// Starts the runtime with D1 in memory, listens on 127.0.0.1 (a free port),
// and prints ONE line of JSON to stdout: {"url": ..., "timings": {...}}.
// Then `POST /run {"file", "function", "kwargs_json", "reset_d1"}` runs that
// test inside Pyodide (runtime/_runtime_tests.py) and answers its outcome
// as JSON. D1 is emptied before each test unless `reset_d1` is false.
// Requests are served one at a time. The process exits when its stdin
// closes (the parent is gone) or on SIGTERM.

import http from "node:http";
import v8 from "node:v8";

// Node 20's optimizing compiler (V8 11.3) can abort the process ("Fatal error:
// unreachable code" in Deoptimizer::DoComputeBuiltinContinuation) when a JS error
// thrown by better-sqlite3 unwinds through Pyodide's frames inside
// `ctx.storage.transactionSync` (a Durable Object store append that conflicts),
// once the D1 tests have warmed the same call paths up. Without inlining it does
// not happen (tests/runtime/test_d1_store.py then test_do_store.py: 85 passed, and
// faster than with --no-opt). Set before any code is optimized.
v8.setFlagsFromString("--no-turbo-inlining");
import path from "node:path";
import { fileURLToPath } from "node:url";
import { awaitPython, startRuntime } from "./index.mjs";

const args = process.argv.slice(2);
const projectIndex = args.indexOf("--project");
const projectDir = projectIndex >= 0 ? args[projectIndex + 1] : path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

// stdout carries the one ready line. What Python prints during a test is
// captured for its report; anything else goes to stderr (the server's log).
const toStderr = (line) => process.stderr.write(line + "\n");
let capture = null;
const runtime = await startRuntime({
  projectDir,
  persist: false,
  forTests: true,
  stdout: (line) => (capture ? capture.stdout.push(line) : toStderr(line)),
  stderr: (line) => (capture ? capture.stderr.push(line) : toStderr(line)),
});
const tests = runtime.importPython("_runtime_tests");

let queue = Promise.resolve();
function serialized(task) {
  const result = queue.then(task);
  queue = result.catch(() => undefined);
  return result;
}

async function readJson(request) {
  const chunks = [];
  for await (const chunk of request) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
}

async function runTest({ file, function: name, kwargs_json = "{}", reset_d1 = true }) {
  if (reset_d1) for (const binding of Object.keys(runtime.env)) if (runtime.env[binding]?.resetForTests) await runtime.resetD1(binding);
  capture = { stdout: [], stderr: [] };
  try {
    const reply = JSON.parse(await awaitPython(tests.run_test(file, name, kwargs_json)));
    await runtime.drain();
    const joined = (lines) => (lines.length ? lines.join("\n") + "\n" : "");
    return JSON.stringify({ ...reply, stdout: joined(capture.stdout), stderr: joined(capture.stderr) });
  } finally {
    capture = null;
  }
}

const server = http.createServer(async (request, response) => {
  try {
    if (request.method === "POST" && request.url === "/run") {
      const body = await readJson(request);
      const reply = await serialized(() => runTest(body));
      response.writeHead(200, { "content-type": "application/json" }).end(reply);
    } else if (request.method === "GET" && request.url === "/timings") {
      response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(runtime.timings));
    } else {
      response.writeHead(404).end();
    }
  } catch (error) {
    response.writeHead(500, { "content-type": "text/plain" }).end(String(error?.stack ?? error));
  }
});
server.keepAliveTimeout = 0;
server.requestTimeout = 0; // a test may run for minutes
server.listen(0, "127.0.0.1", () => {
  const { port } = server.address();
  process.stdout.write(JSON.stringify({ url: `http://127.0.0.1:${port}`, timings: runtime.timings }) + "\n");
});

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  server.close();
  await runtime.close().catch((error) => toStderr(`runtime close failed: ${error}`));
  process.exit(0);
}
process.stdin.on("end", stop);
process.stdin.on("close", stop);
process.stdin.resume();
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
