// The local Workers runtime: a Python Worker's world, offline, in one Node process.
//
// `wrangler dev` cannot run a Python Worker offline (workerd downloads its
// Pyodide bundle at start), so this harness assembles the same pieces from
// local packages: Pyodide 314.0.4 (npm), the real `workers` SDK and the
// project's dependencies vendored from PyPI into python_modules/
// (scripts/vendor.py), and real bindings: D1 from miniflare (runtime/d1.mjs)
// and Durable Object namespaces (runtime/durable-objects.mjs). Python code
// runs unmodified and sees what it sees on Cloudflare.
//
//   const runtime = await startRuntime({ projectDir, persist: true, d1DatabaseId });
//   const worker = runtime.loadWorker({ main: "entry", durableObjects: { SESSIONS: "AgentSession" } });
//   const response = await worker.fetch(new Request("http://localhost/"));
//   await runtime.close();
//
// Used by the pytest plugin (runtime/test-server.mjs), the benchmarks, and
// the dev server. It is a harness for this project, not a general workerd.

import path from "node:path";
import { D1Bridge } from "./d1.mjs";
import { BackgroundTasks, DurableObjectNamespace, workerEntrypoint } from "./durable-objects.mjs";
import { loadPythonRuntime } from "./pyodide-host.mjs";

export { PROJECT_MOUNT } from "./pyodide-host.mjs";

/** Where wrangler keeps local D1 data, so `wrangler d1 ... --local` sees the same databases. */
export function wranglerD1PersistDir(projectDir, persistRoot = path.join(projectDir, ".wrangler", "state")) {
  return path.join(persistRoot, "v3", "d1");
}

/**
 * Start Pyodide and miniflare's D1 (in parallel) and wire them together.
 *
 * @param {object} [options]
 * @param {string} [options.projectDir] the repo root (holds src/, python_modules/)
 * @param {boolean | string} [options.persist] false: D1 in memory (tests); true: under
 *   `<projectDir>/.wrangler/state` like `wrangler dev`; a string: that persist root (like `--persist-to`)
 * @param {string} [options.d1DatabaseId] the `database_id` (or `preview_database_id`) of the `DB` binding
 * @param {Record<string, string>} [options.d1Databases] binding name -> database_id, for several databases
 * @param {Record<string, string>} [options.vars] plain-text env vars
 * @param {Record<string, boolean>} [options.compatFlags] compat flags to override
 * @param {() => Promise<void>} [options.beforeD1] awaited before miniflare opens D1, while
 *   Pyodide loads (the dev server applies migrations with wrangler here: two workerd
 *   processes must not open one database at once)
 * @param {(line: string) => void} [options.stdout] where Python's stdout lines go
 * @param {(line: string) => void} [options.stderr] where Python's stderr lines go
 * @param {(message: string) => void} [options.log] harness diagnostics (waitUntil failures, aborts)
 */
export async function startRuntime({
  projectDir = process.cwd(),
  persist = false,
  d1DatabaseId = "local-durable-agents",
  d1Databases = { DB: d1DatabaseId },
  vars = {},
  compatFlags = {},
  beforeD1,
  stdout,
  stderr,
  log = (message) => process.stderr.write(`[runtime] ${message}\n`),
} = {}) {
  const started = performance.now();
  projectDir = path.resolve(projectDir);
  const env = { ...vars };
  const tasks = new BackgroundTasks((error) => log(`waitUntil task failed: ${error?.stack ?? error}`));
  const cloudflareWorkersModule = {
    env,
    waitUntil: (promise) => tasks.add(promise),
    WorkerEntrypoint: class WorkerEntrypoint {},
    DurableObject: class DurableObject {},
    WorkflowEntrypoint: class WorkflowEntrypoint {},
    RpcTarget: class RpcTarget {},
  };

  let persistDir = false;
  if (persist) persistDir = wranglerD1PersistDir(projectDir, persist === true ? undefined : path.resolve(persist));

  const timeD1 = (async () => {
    if (beforeD1) await beforeD1();
    const t = performance.now();
    const bridge = await D1Bridge.start({ databases: d1Databases, persistDir });
    return { bridge, ms: Math.round(performance.now() - t) };
  })();
  let python;
  let d1;
  try {
    [python, d1] = await Promise.all([
      loadPythonRuntime({ projectDir, cloudflareWorkersModule, compatFlags, stdout, stderr }),
      timeD1,
    ]);
  } catch (error) {
    // Do not leave workerd running when Pyodide failed to load (or the reverse).
    await timeD1.then(({ bridge }) => bridge.dispose()).catch(() => undefined);
    throw error;
  }
  const { pyodide } = python;
  const { bridge } = d1;
  for (const binding of Object.keys(d1Databases)) env[binding] = bridge.database(binding);

  const harness = pyodide.pyimport("_workers_harness");
  const host = {
    env,
    tasks,
    log,
    instantiate: (cls, ctx, hostEnv) => harness.instantiate(cls, ctx, hostEnv),
    invoke: (instance, method, args) => awaitPython(harness.invoke(instance, method, args)),
  };
  const namespaces = [];

  const runtime = {
    pyodide,
    env,
    projectDir,
    persistDir,
    timings: {
      ...python.timings,
      miniflareMs: d1.ms,
      startMs: Math.round(performance.now() - started),
    },

    /** Import a Python module by name (a PyProxy; the caller destroys it when done). */
    importPython(name) {
      return pyodide.pyimport(name);
    },

    /** Bind a Python Durable Object class into env under `binding`; returns the namespace. */
    durableObjectNamespace(binding, pythonClass, className = pythonClass.__name__) {
      const namespace = new DurableObjectNamespace(host, pythonClass, className);
      namespaces.push(namespace);
      env[binding] = namespace;
      return namespace;
    },

    /** Serve a Python WorkerEntrypoint class: a new instance per call, as workerd does. */
    workerEntrypoint(pythonClass) {
      return workerEntrypoint(host, pythonClass);
    },

    /**
     * Load a Worker module (default `src/entry.py`): bind its Durable Object
     * classes, and serve its entrypoint class.
     */
    loadWorker({ main = "entry", entrypoint = "Default", durableObjects = {} } = {}) {
      const module = pyodide.pyimport(main);
      for (const [binding, className] of Object.entries(durableObjects)) {
        runtime.durableObjectNamespace(binding, module[className], className);
      }
      return { module, ...workerEntrypoint(host, module[entrypoint]) };
    },

    /** Wait for every `waitUntil` task started so far (and those they start). */
    drain() {
      return tasks.drain();
    },

    /** Empty a D1 database (drop every table): a fresh database per test without a restart. */
    resetD1(binding = "DB") {
      return env[binding].resetForTests();
    },

    async close() {
      await tasks.drain();
      for (const namespace of namespaces) namespace.dispose();
      harness.destroy();
      await bridge.dispose();
    },
  };
  // For Python code running in the harness (in-runtime tests): bind a Python
  // class as a Durable Object namespace or serve it as a Worker. Arguments
  // from Python are borrowed proxies, released when the call returns, so the
  // classes are copied.
  pyodide.registerJsModule("_local_runtime", {
    durableObjectNamespace: (binding, pythonClass) => runtime.durableObjectNamespace(binding, pythonClass.copy()),
    workerEntrypoint: (pythonClass) => runtime.workerEntrypoint(pythonClass.copy()),
    drain: () => runtime.drain(),
  });
  return runtime;
}

// Calling an async Python function from JS gives a proxy of the coroutine;
// awaiting it runs it on Pyodide's event loop. Release the proxy afterwards.
export async function awaitPython(awaitable) {
  try {
    return await awaitable;
  } finally {
    if (awaitable && typeof awaitable.destroy === "function") {
      try {
        awaitable.destroy();
      } catch {
        // already released by Pyodide
      }
    }
  }
}
