// Pyodide set up the way workerd sets it up for a Python Worker, from the repo's files.
//
// Loads the npm `pyodide` (the version the config's compatibility date and
// flags select, checked by index.mjs), mounts the project directory at
// /project and this runtime/ directory at /runtime, and prepares what a
// Python Worker sees on workerd:
// - the environment: HOME=/session (also the working directory) and
//   PYTHONHASHSEED=111, as workerd sets them;
// - `sys.path`: the standard library, then python_modules/, then
//   site-packages, then the Worker's own modules (src/); nothing else of the
//   project is importable (runtime/'s own modules are loaded by path);
// - `.pth` files in python_modules/ processed (`site.addsitedir`) when the
//   `python_process_pth_files` flag is on, as workerd does: the SDK's
//   `_workers_sdk_patch_loader.pth` registers its package patches;
// - the `_cloudflare` package (runtime/_cloudflare/) in site-packages, and
//   top-level rules: outside a request, `random`'s functions and
//   `os.urandom` refuse (workerd's errors), C-level getentropy() calls are
//   refused unless allowed (`allow_bad_entropy_calls`), and while the
//   runtime runs the Worker's top level the wall clock is frozen;
// - `_cloudflare_compat_flags`: every workerd flag (by its enable name) as a
//   boolean, compiled for the config's date and flags; an unknown name
//   raises AttributeError;
// - `_pyodide_entrypoint_helper` with workerd's members: doAnImport,
//   cloudflareWorkersModule, cloudflareSocketsModule, workerEntrypoint,
//   patchWaitUntil, TEST_ONLY_THROW_PYTHON_WORKERS_INTERNAL_ERROR.
// Bytecode is cached under .cache/pyodide-pycache (CPython 3.14 .pyc files),
// which cuts the import of pydantic and httpx by about a third on later starts.

import nodeCrypto from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { loadPyodide } from "pyodide";

export const PROJECT_MOUNT = "/project";
export const RUNTIME_MOUNT = "/runtime";
const RUNTIME_DIR = path.dirname(fileURLToPath(import.meta.url));
// This kit: its python_modules/ serves a Worker project that has none of its own.
const KIT_DIR = path.dirname(RUNTIME_DIR);
const KIT_MOUNT = "/kit";
const HOME = "/session";
// What `time.time()` reads while the runtime runs a Worker's top level (workerd's
// clock does not move outside a request; it read 0.335 s in one measurement).
const FROZEN_NOW_MS = 0;
// The bytes an allowed top-level getentropy() call gets: a fixed pattern, as on workerd.
const BAD_ENTROPY_BYTE = 43;

// --- C-level entropy: Pyodide's getentropy() ends in node:crypto's randomFillSync ---

// Pyodide instances that have not seen their first request. A call from one of
// them (a view of its wasm memory) is refused unless its allowance byte is > 0.
const gated = new Set();
const realRandomFillSync = nodeCrypto.randomFillSync;
nodeCrypto.randomFillSync = function randomFillSync(buffer, ...rest) {
  for (const gate of gated) {
    const memory = gate.module.HEAPU8;
    if (buffer?.buffer !== memory.buffer) continue;
    if (memory[gate.allowanceAddress] > 0) {
      memory[gate.allowanceAddress] -= 1;
      buffer.fill(BAD_ENTROPY_BYTE);
      return buffer;
    }
    const error = new Error(
      "Disallowed operation called within global scope: a C extension asked for entropy " +
        "(getentropy) while the Worker's top level ran, outside any request. On workerd this " +
        "is a fatal error; generate random values inside a request handler.",
    );
    gate.log?.(error.message);
    throw error;
  }
  return realRandomFillSync.call(this, buffer, ...rest);
};

// --- the two runtime-internal modules the workers SDK imports ---

/**
 * The stand-in for workerd's `_pyodide_entrypoint_helper`: workerd's members, no others.
 * @param {object} options
 * @param {object} options.cloudflareWorkersModule what `import ... from "cloudflare:workers"` gives
 * @param {string} options.projectDir where `python_modules/...` JS imports resolve
 * @param {Record<string, boolean>} options.compatFlags the compiled flags
 */
function entrypointHelperModule({ cloudflareWorkersModule, modulesDir, compatFlags }) {
  const patched = new WeakSet();
  return {
    doAnImport(name) {
      const target = name.startsWith("python_modules/")
        ? pathToFileURL(path.join(modulesDir, name.slice("python_modules/".length))).href
        : name;
      return import(target);
    },
    cloudflareWorkersModule,
    cloudflareSocketsModule: {
      connect() {
        throw new Error("cloudflare:sockets is not available in the local runtime");
      },
    },
    workerEntrypoint: cloudflareWorkersModule.WorkerEntrypoint,
    // A Python awaitable handed to ctx.waitUntil() arrives as a borrowed
    // proxy that Pyodide destroys when the call returns: keep a copy alive
    // until it settles. workerd does this for ExecutionContext only, once.
    patchWaitUntil(ctx) {
      if (Object.prototype.toString.call(ctx) !== "[object ExecutionContext]" || patched.has(ctx)) return;
      const original = ctx.waitUntil.bind(ctx);
      ctx.waitUntil = (value) => {
        if (value && typeof value.copy === "function") {
          const copy = value.copy();
          original(Promise.resolve(copy).finally(() => copy.destroy()));
        } else {
          original(value);
        }
      };
      patched.add(ctx);
    },
    TEST_ONLY_THROW_PYTHON_WORKERS_INTERNAL_ERROR(message) {
      if (!compatFlags.experimental) {
        throw new Error("TEST_ONLY_THROW_PYTHON_WORKERS_INTERNAL_ERROR requires the experimental compatibility flag");
      }
      const error = new Error(message);
      error.name = "PythonWorkersInternalError";
      throw error;
    },
  };
}

/** Copy runtime/_cloudflare/ into Pyodide's site-packages (as workerd installs its own). */
function installCloudflarePackage(pyodide) {
  const sitePackages = pyodide.runPython("import sysconfig; sysconfig.get_path('purelib')");
  const target = `${sitePackages}/_cloudflare`;
  pyodide.FS.mkdirTree(target);
  const source = path.join(RUNTIME_DIR, "_cloudflare");
  for (const file of readdirSync(source)) {
    if (file.endsWith(".py")) pyodide.FS.writeFile(`${target}/${file}`, readFileSync(path.join(source, file)));
  }
}

/**
 * Load Pyodide with the project mounted, workerd's search path and top-level
 * rules, and the SDK's runtime modules registered.
 *
 * @param {object} options
 * @param {string} options.projectDir holds python_modules/ and the Worker's modules
 * @param {string} [options.workerDir] the Worker's modules, relative to projectDir
 * @param {string} [options.pythonModulesDir] the packages: default the project's python_modules/
 *   if it has one (with the workers SDK), else this kit's
 * @param {object} options.cloudflareWorkersModule
 * @param {Record<string, boolean>} options.compatFlags `_cloudflare_compat_flags`, compiled
 * @param {string} options.pyodideVersion the version the config selects (checked)
 * @returns {Promise<{pyodide: object, timings: object, topLevel: Function, beginRequests: Function,
 *   loadRuntimeModule: Function}>}
 */
export async function loadPythonRuntime({
  projectDir,
  workerDir = "src",
  pythonModulesDir,
  cloudflareWorkersModule,
  compatFlags,
  pyodideVersion,
  stdout = (line) => process.stdout.write(line + "\n"),
  stderr = (line) => process.stderr.write(line + "\n"),
  log,
}) {
  const ownModules = path.join(projectDir, "python_modules");
  const modules = path.resolve(
    pythonModulesDir ?? (existsSync(path.join(ownModules, "workers")) ? ownModules : path.join(KIT_DIR, "python_modules")),
  );
  if (!existsSync(path.join(modules, "workers"))) {
    throw new Error(`${modules} has no vendored packages; run scripts/setup-runtime (or python3 scripts/vendor.py)`);
  }
  const started = performance.now();
  const pyodide = await loadPyodide({ stdout, stderr, env: { HOME, PYTHONHASHSEED: "111" } });
  const loaded = performance.now();
  if (pyodide.version !== pyodideVersion) {
    throw new Error(`loaded Pyodide ${pyodide.version}, but the config selects ${pyodideVersion}`);
  }

  // Another project's Worker (a --config elsewhere): the kit's python_modules/ if the
  // project has none, and the kit's bytecode cache (nothing written into that project).
  const ownProject = path.resolve(projectDir) === KIT_DIR;
  const pycacheDir = path.join(KIT_DIR, ".cache", "pyodide-pycache");
  mkdirSync(pycacheDir, { recursive: true });
  const mounts = [[PROJECT_MOUNT, projectDir], [RUNTIME_MOUNT, RUNTIME_DIR]];
  const pythonModules = modules === ownModules ? `${PROJECT_MOUNT}/python_modules` : `${KIT_MOUNT}/python_modules`;
  if (modules !== ownModules) mounts.push([pythonModules, modules]);
  const pycache = ownProject ? `${PROJECT_MOUNT}/.cache/pyodide-pycache` : `${KIT_MOUNT}/pycache`;
  if (!ownProject) mounts.push([pycache, pycacheDir]);
  for (const [mount, dir] of mounts) {
    pyodide.FS.mkdirTree(mount);
    pyodide.mountNodeFS(mount, dir);
  }
  installCloudflarePackage(pyodide);
  pyodide.registerJsModule("_cloudflare_compat_flags", { ...compatFlags });
  pyodide.registerJsModule(
    "_pyodide_entrypoint_helper",
    entrypointHelperModule({ cloudflareWorkersModule, modulesDir: modules, compatFlags }),
  );

  // The Worker's top level: from here to its first event. Python code the
  // runtime runs meanwhile runs inside topLevel(): the clock is frozen.
  const gate = { module: pyodide._module, allowanceAddress: 0, log };
  let inRequest = false;
  const topLevel = (run) => {
    if (inRequest) return run();
    const now = Date.now;
    Date.now = () => FROZEN_NOW_MS;
    try {
      return run();
    } finally {
      Date.now = now;
    }
  };
  const workerModules = path.posix.join(PROJECT_MOUNT, workerDir.split(path.sep).join("/"));
  topLevel(() => {
    gate.allowanceAddress = pyodide.runPython(`
import sys
sys.dont_write_bytecode = False
sys.pycache_prefix = ${JSON.stringify(pycache)}
from _cloudflare import allow_entropy, top_level
top_level.before_top_level()
allow_entropy.allowance_address()
`);
    gated.add(gate);
    // workerd's order: the standard library, python_modules, site-packages, then
    // the Worker's own modules. Pyodide starts with "" (the working directory) first.
    pyodide.runPython(`
import sys, site
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
first_site = next(i for i, p in enumerate(sys.path) if p.endswith("site-packages"))
sys.path.insert(first_site, ${JSON.stringify(pythonModules)})
sys.path.append(${JSON.stringify(workerModules)})
if ${compatFlags.python_process_pth_files ? "True" : "False"}:
    site.addsitedir(${JSON.stringify(pythonModules)})
else:
    # Without the flag workerd loads its own copy of the SDK's package patches.
    import importlib.util
    for name in ("_workers_sdk_entropy_import_context", "_workers_sdk_package_patches"):
        if importlib.util.find_spec(name) is not None:
            __import__(name)
del first_site
`);
    pyodide.runPython("import workers");
  });

  // runtime/'s own Python modules: loaded by path, so they are not importable by name.
  const runtimeModules = new Map();
  const loadRuntimeModule = (name) => {
    if (!runtimeModules.has(name)) {
      const file = `${RUNTIME_MOUNT}/${name}.py`;
      const scope = pyodide.globals.get("dict")();
      try {
        const load = pyodide.runPython(
          `
def load(path, name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
load`,
          { globals: scope },
        );
        runtimeModules.set(name, topLevel(() => load(file, name)));
        load.destroy();
      } finally {
        scope.destroy();
      }
    }
    return runtimeModules.get(name);
  };
  loadRuntimeModule("_workers_harness");
  const imported = performance.now();

  return {
    pyodide,
    topLevel,
    loadRuntimeModule,
    isRuntimeModule: (name) => /^_\w+$/.test(name) && existsSync(path.join(RUNTIME_DIR, `${name}.py`)),
    /** The first event: leave top level (idempotent). */
    beginRequests() {
      if (inRequest) return;
      inRequest = true;
      gated.delete(gate);
      pyodide.runPython("from _cloudflare.top_level import before_first_request; before_first_request()");
    },
    get inRequest() {
      return inRequest;
    },
    close() {
      gated.delete(gate);
      for (const module of runtimeModules.values()) {
        try {
          module.destroy();
        } catch {
          // Pyodide is gone (a fatal error, such as refused entropy at top level)
        }
      }
      runtimeModules.clear();
    },
    timings: {
      loadPyodideMs: Math.round(loaded - started),
      importWorkersMs: Math.round(imported - loaded),
    },
  };
}
