// The local Workers runtime: a Python Worker's world, offline, in one Node process.
//
// `wrangler dev` cannot run a Python Worker offline (workerd downloads its
// Pyodide bundle at start), so this harness assembles the same pieces from
// local packages: the npm Pyodide that the config's compatibility date and
// flags select on workerd (runtime/compat.mjs; checked at start), the real
// `workers` SDK and the project's dependencies vendored from PyPI into
// python_modules/ (scripts/vendor.py), and real bindings: D1 from miniflare
// (runtime/d1.mjs) and Durable Object namespaces (runtime/durable-objects.mjs).
// Python code runs unmodified, under workerd's rules (runtime/pyodide-host.mjs):
// its import path, `.pth` processing, the compat-flags module, no entropy and
// a frozen clock at top level (until the first event).
//
//   const runtime = await startRuntime({ projectDir, persist: true, d1DatabaseId });
//   const worker = runtime.loadWorker({ main: "entry", durableObjects: { SESSIONS: "AgentSession" } });
//   const response = await worker.fetch(new Request("http://localhost/"));
//   await runtime.close();
//
// Used by the pytest plugin (runtime/test-server.mjs), the benchmarks, and
// the dev server. It is a harness for this project, not a general workerd.

import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { D1Bridge } from "./d1.mjs";
import { kvBindings } from "./kv.mjs";
import { BackgroundTasks, DurableObjectNamespace, installOutputGate, workerEntrypoint } from "./durable-objects.mjs";
import { compileCompatibility } from "./compat.mjs";
import { CONFIG_NAMES, parseConfigFile } from "./wrangler-config.mjs";
import { PROJECT_MOUNT, loadPythonRuntime } from "./pyodide-host.mjs";

export { PROJECT_MOUNT } from "./pyodide-host.mjs";

/** The version of the npm `pyodide` this runtime loads. */
export function installedPyodideVersion() {
  const require = createRequire(import.meta.url);
  return JSON.parse(readFileSync(require.resolve("pyodide/package.json"), "utf8")).version;
}

/**
 * The compiled compatibility date and flags, refused (an Error) where workerd
 * would refuse them or where this runtime's Pyodide is not the one they select.
 */
export function checkCompatibility(date, flags, pyodideVersion = installedPyodideVersion()) {
  const compiled = compileCompatibility(date, flags);
  const shown = `compatibility_date ${JSON.stringify(date)}, compatibility_flags ${JSON.stringify(flags)}`;
  if (compiled.errors.length) throw new Error(`${shown}: ${compiled.errors.join("; ")}`);
  if (compiled.python === null) throw new Error(`${shown}: not a Python Worker (no python_workers flag)`);
  const wanted = compiled.python.pyodide;
  if (wanted !== pyodideVersion) {
    throw new Error(
      `${shown} select Pyodide ${wanted} on workerd (${compiled.python.flag}), but the local runtime ` +
        `has Pyodide ${pyodideVersion} (package.json pins it). Pin pyodide ${wanted} in package.json ` +
        `and run scripts/setup-runtime, or change the compatibility date or flags.`,
    );
  }
  return compiled;
}

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
 * @param {string} [options.compatibilityDate] default: `compatibility_date` of <projectDir>'s
 *   wrangler.json, .jsonc or .toml (or, if it has none, of this repo's config)
 * @param {string[]} [options.compatibilityFlags] default: its `compatibility_flags`
 * @param {string} [options.workerName] the Worker's `name` (part of Durable Object ids, as in
 *   `wrangler dev`); default: that of <projectDir>/wrangler.toml
 * @param {string} [options.workerDir] the Worker's own modules, relative to projectDir (default src)
 * @param {string} [options.pythonModulesDir] the packages (default `<projectDir>/python_modules`)
 * @param {Record<string, string>} [options.kvNamespaces] KV binding name -> namespace id (miniflare's KV)
 * @param {{binding: string | null, kind: string, key: string}[]} [options.unservedBindings] bindings of
 *   the config the runtime does not serve: `env.<binding>` raises an Error naming it
 * @param {boolean} [options.forTests] for the in-runtime test runner: register `_local_runtime`
 *   (bind Python classes from test code) and start in request context
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
  compatibilityDate,
  compatibilityFlags,
  workerName,
  workerDir = "src",
  pythonModulesDir,
  kvNamespaces = {},
  unservedBindings = [],
  forTests = false,
  beforeD1,
  stdout,
  stderr,
  log = (message) => process.stderr.write(`[runtime] ${message}\n`),
} = {}) {
  const started = performance.now();
  projectDir = path.resolve(projectDir);
  // The config's settings by default: the project's wrangler.toml, else (a scratch
  // project made from this repo's Worker, say) the one of the repo the runtime is in.
  const project =
    readProjectConfig(projectDir) ?? readProjectConfig(path.join(path.dirname(fileURLToPath(import.meta.url)), ".."));
  compatibilityDate ??= project?.compatibilityDate;
  compatibilityFlags ??= project?.compatibilityFlags ?? [];
  workerName ??= project?.name ?? "";
  const compatibility = checkCompatibility(compatibilityDate, compatibilityFlags);
  // Durable Objects' outgoing fetch() waits for their pending storage writes (the output gate).
  installOutputGate();
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
  // KV and Durable Object storage beside D1, in wrangler dev's layout (<persist>/v3/kv, v3/do).
  const stateRoot = persistDir ? path.dirname(persistDir) : null;

  const timeD1 = (async () => {
    if (beforeD1) await beforeD1();
    const t = performance.now();
    const bridge = await D1Bridge.start({
      databases: d1Databases,
      persistDir,
      kvNamespaces,
      kvPersistDir: stateRoot ? path.join(stateRoot, "kv") : false,
    });
    return { bridge, ms: Math.round(performance.now() - t) };
  })();
  let python;
  let d1;
  try {
    [python, d1] = await Promise.all([
      loadPythonRuntime({
        projectDir,
        workerDir,
        pythonModulesDir,
        cloudflareWorkersModule,
        compatFlags: compatibility.module,
        pyodideVersion: compatibility.python.pyodide,
        stdout,
        stderr,
        log,
      }),
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
  Object.assign(env, await kvBindings(bridge.miniflare, Object.keys(kvNamespaces)));
  for (const { binding, kind, key } of unservedBindings) {
    if (!binding) continue;
    Object.defineProperty(env, binding, {
      enumerable: true,
      configurable: true,
      get() {
        throw new Error(`env.${binding}: the ${kind} binding ${binding} ([${key}] in the config) is not served by the local runtime`);
      },
    });
  }

  const harness = python.loadRuntimeModule("_workers_harness");
  const host = {
    env,
    tasks,
    // Durable Object storage: <persist>/v3/do/<worker>-<class>/<id>.sqlite, or in memory.
    storageRoot: stateRoot ? path.join(stateRoot, "do") : null,
    log,
    beginRequests: () => python.beginRequests(),
    instantiate: (cls, ctx, hostEnv) => harness.instantiate(cls, ctx, hostEnv),
    invoke: (instance, method, args) => awaitPython(harness.invoke(instance, method, args)),
  };
  const namespaces = [];

  const runtime = {
    pyodide,
    env,
    projectDir,
    persistDir,
    workerName,
    compatibility: {
      date: compatibilityDate,
      flags: compatibilityFlags,
      pyodide: compatibility.python.pyodide,
      module: compatibility.module,
    },
    timings: {
      ...python.timings,
      miniflareMs: d1.ms,
      startMs: Math.round(performance.now() - started),
    },

    /**
     * Import a Python module by name (a PyProxy; the caller destroys it when done).
     * A module of runtime/ itself (`_dev_agent`, `_runtime_tests`, ...) is loaded
     * by path, as it is not on the Worker's import path; calls into it made
     * before the first event run as top-level code, like the import itself.
     */
    importPython(name) {
      if (python.isRuntimeModule(name)) return atTopLevel(python.loadRuntimeModule(name).copy());
      return python.topLevel(() => pyodide.pyimport(name));
    },

    /** The first event: leave top level for good (the runtime does this itself on the first event). */
    beginRequests() {
      python.beginRequests();
    },

    /** Bind a Python Durable Object class into env under `binding`; returns the namespace. */
    durableObjectNamespace(binding, pythonClass, className = pythonClass.__name__) {
      // The namespace key `wrangler dev` (miniflare) gives workerd: "<worker name>-<class name>".
      const namespace = new DurableObjectNamespace(host, pythonClass, className, `${workerName}-${className}`);
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
      const module = importWorkerModule(main);
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
      python.close();
      await bridge.dispose();
    },
  };
  // Calls into a runtime/ module before the first event run as top-level code.
  const atTopLevel = (module) =>
    new Proxy(module, {
      get(target, property) {
        const value = target[property];
        if (value instanceof pyodide.ffi.PyProxy && typeof value === "function") {
          return (...args) => python.topLevel(() => value(...args));
        }
        return typeof value === "function" ? value.bind(target) : value;
      },
    });

  // The Worker's module, imported at top level; if that fails, say why: the
  // Python error and the line of the Worker's code that raised it.
  const importWorkerModule = (main) => {
    try {
      return python.topLevel(() => pyodide.pyimport(main));
    } catch (error) {
      throw workerStartError(main, error, `${PROJECT_MOUNT}/${workerDir}/`, python.inRequest);
    }
  };

  if (forTests) {
    // For Python code running in the harness (in-runtime tests): bind a Python
    // class as a Durable Object namespace or serve it as a Worker. Arguments
    // from Python are borrowed proxies, released when the call returns, so the
    // classes are copied. Workers do not see this module.
    pyodide.registerJsModule("_local_runtime", {
      durableObjectNamespace: (binding, pythonClass) => runtime.durableObjectNamespace(binding, pythonClass.copy()),
      workerEntrypoint: (pythonClass) => runtime.workerEntrypoint(pythonClass.copy()),
      drain: () => runtime.drain(),
    });
    python.beginRequests();
  }
  return runtime;
}

/** name, date and flags of the wrangler.json, .jsonc or .toml in `dir` (wrangler's order), or null. */
function readProjectConfig(dir) {
  const file = CONFIG_NAMES.map((name) => path.join(dir, name)).find((candidate) => existsSync(candidate));
  if (!file) return null;
  const config = parseConfigFile(file);
  return {
    name: config.name,
    compatibilityDate: config.compatibility_date,
    compatibilityFlags: config.compatibility_flags ?? [],
  };
}

/**
 * The error a Worker whose module fails to import starts with: the Python
 * exception, the line of the Worker's own code it came from, and the traceback.
 */
export function workerStartError(main, error, workerPrefix, inRequest) {
  const traceback = String(error?.message ?? error).trimEnd();
  const lines = traceback.split("\n");
  const raised = lines.findLast((line) => line && !line.startsWith(" ")) ?? traceback;
  let where = "";
  for (let i = lines.length - 1; i >= 0; i--) {
    const frame = /^ {2}File "([^"]+)", line (\d+)/.exec(lines[i]);
    if (frame && frame[1].startsWith(workerPrefix)) {
      const code = lines[i + 1]?.startsWith("    ") ? `: ${lines[i + 1].trim()}` : "";
      where = `${frame[1].slice(PROJECT_MOUNT.length + 1)}, line ${frame[2]}${code}`;
      break;
    }
  }
  const phase = inRequest ? "" : " (its top level, outside any request, as on workerd)";
  const message = `the Worker did not start: importing ${main}${phase} raised ${raised}${where ? `\n  at ${where}` : ""}`;
  const startError = new Error(message);
  startError.name = "WorkerStartError";
  startError.stack = `${startError.name}: ${message}\n\nPython traceback:\n${traceback}`;
  startError.cause = error;
  return startError;
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
