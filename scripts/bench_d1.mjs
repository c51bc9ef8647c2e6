// Benchmark: milliseconds per atomic D1 append (one 5-message batch), from Python inside the local runtime.
//
//   node scripts/bench_d1.mjs [--appends 200]
//
// Starts the runtime (D1 in memory), then from Python appends 5 messages
// at a time through `d1_store(env.DB)`: one `batch()` of 5 INSERTs plus the
// session upsert, a single round trip to miniflare's D1. Prints the
// runtime's start-up timings and the median / p90 ms per append, plus the
// median for a one-row read (`load_messages` of a short session).

import path from "node:path";
import { fileURLToPath } from "node:url";
import { startRuntime } from "../runtime/index.mjs";

const args = process.argv.slice(2);
const appendsIndex = args.indexOf("--appends");
const appends = appendsIndex >= 0 ? Number(args[appendsIndex + 1]) : 200;
const projectDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

const runtime = await startRuntime({ projectDir });
try {
  const t = runtime.timings;
  console.log(
    `runtime ready in ${t.startMs} ms (loadPyodide ${t.loadPyodideMs} ms, import workers ${t.importWorkersMs} ms, miniflare ${t.miniflareMs} ms in parallel)`,
  );
  const report = await runtime.pyodide.runPythonAsync(`
import json, statistics, time
from workers import env

started = time.perf_counter()
import pydantic, httpx, durable_agents
from durable_agents.cloudflare import d1_store
from durable_agents.messages import Message, ToolCall, Usage
import_ms = (time.perf_counter() - started) * 1000

store = d1_store(env.DB)
await store.create_tables()

def batch(n):
    call = ToolCall(f"call-{n}", "lookup", {"query": "weather in Lisbon", "n": n})
    return [
        Message.user(f"question {n}"),
        Message.assistant("", [call], Usage(120, 30)),
        Message.tool_result(call, '{"temperature": 21, "unit": "C"}'),
        Message.assistant(f"It is 21 C ({n}).", usage=Usage(150, 12)),
        Message.user("thanks"),
    ]

for n in range(10):  # warm up
    await store.append_messages_atomic(f"warm-{n}", 0, batch(n))

append_ms = []
for n in range(${appends}):
    session = f"bench-{n % 20}"
    seq = (n // 20) * 5
    t0 = time.perf_counter()
    await store.append_messages_atomic(session, seq, batch(n))
    append_ms.append((time.perf_counter() - t0) * 1000)

load_ms = []
for n in range(50):
    t0 = time.perf_counter()
    await store.load_messages(f"warm-{n % 10}")
    load_ms.append((time.perf_counter() - t0) * 1000)

json.dumps({
    "appends": len(append_ms),
    "median_append_ms": statistics.median(append_ms),
    "p90_append_ms": statistics.quantiles(append_ms, n=10)[-1],
    "median_load_ms": statistics.median(load_ms),
    "import_durable_agents_ms": import_ms,
})
`);
  const r = JSON.parse(report);
  console.log(`then import pydantic, httpx, durable_agents (+ .cloudflare): ${r.import_durable_agents_ms.toFixed(0)} ms`);
  console.log(
    `atomic append of 5 messages (1 D1 batch): median ${r.median_append_ms.toFixed(2)} ms, p90 ${r.p90_append_ms.toFixed(2)} ms over ${r.appends} appends`,
  );
  console.log(`load_messages of a 5-message session: median ${r.median_load_ms.toFixed(2)} ms`);
} finally {
  await runtime.close();
}
