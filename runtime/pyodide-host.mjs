// Pyodide set up the way Cloudflare's Python Workers see it, from the repo's files.
//
// Loads the npm `pyodide` (314.0.4 = CPython 3.14, the Pyodide behind the
// `python_workers_20260610` compat flag), mounts the project directory at
// /project (so `src/`, `tests/` and the vendored `python_modules/` are read
// from disk, live), puts them on sys.path, and registers the two
// runtime-internal modules the `workers` SDK imports, which workerd
// normally provides:
//   _cloudflare_compat_flags     attribute access gives a boolean per flag
//   _pyodide_entrypoint_helper   the `cloudflare:workers` module, a sockets
//                                stub, doAnImport, patch_env_helper, patchWaitUntil
// Bytecode is cached under .cache/pyodide-pycache (CPython 3.14 .pyc files),
// which cuts the import of pydantic and httpx by about a third on later starts.

import { existsSync, mkdirSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { loadPyodide } from "pyodide";

export const PROJECT_MOUNT = "/project";

// Flags Cloudflare sets for `python_workers_20260610`, as the SDK reads them.
// Any other flag reads as false, like an unknown flag on Cloudflare.
const COMPAT_FLAGS = {
  python_request_headers_preserve_commas: true,
  python_workflows_implicit_dependencies: true,
};

function compatFlagsModule(overrides) {
  const flags = { ...COMPAT_FLAGS, ...overrides };
  return new Proxy(flags, {
    get: (target, name) => (typeof name === "string" ? Boolean(target[name]) : undefined),
  });
}

/**
 * The stand-in for workerd's `_pyodide_entrypoint_helper`.
 * @param {object} options
 * @param {object} options.cloudflareWorkersModule what `import ... from "cloudflare:workers"` gives
 * @param {string} options.projectDir where `python_modules/...` JS imports resolve
 * @param {object} options.pyodide for recognising Python proxies
 */
function entrypointHelperModule({ cloudflareWorkersModule, projectDir, pyodide }) {
  const { PyProxy } = pyodide.ffi;
  return {
    cloudflareWorkersModule,
    cloudflareSocketsModule: {
      connect() {
        throw new Error("cloudflare:sockets is not available in the local runtime");
      },
    },
    doAnImport(name) {
      const target = name.startsWith("python_modules/") ? pathToFileURL(path.join(projectDir, name)).href : name;
      return import(target);
    },
    // Called by the SDK's `patch_env` context manager (a Python generator):
    // set the keys on env for the duration of the `with` block.
    // `patch` is the JS Map that `to_js(dict)` makes.
    *patch_env_helper(patch) {
      const env = cloudflareWorkersModule.env;
      const entries = patch instanceof Map ? [...patch.entries()] : Object.entries(patch);
      const saved = new Map(entries.map(([k]) => [k, Object.getOwnPropertyDescriptor(env, k)]));
      for (const [key, value] of entries) env[key] = value;
      try {
        yield;
      } finally {
        for (const [key, descriptor] of saved) {
          if (descriptor) Object.defineProperty(env, key, descriptor);
          else delete env[key];
        }
      }
    },
    // A Python awaitable handed to ctx.waitUntil() arrives as a borrowed
    // proxy that Pyodide destroys when the call returns: keep a copy alive
    // until it settles. workerd does this for ExecutionContext only.
    patchWaitUntil(ctx) {
      if (Object.prototype.toString.call(ctx) !== "[object ExecutionContext]") return;
      const original = ctx.waitUntil.bind(ctx);
      ctx.waitUntil = (value) => {
        if (value instanceof PyProxy) {
          const copy = value.copy();
          original(Promise.resolve(copy).finally(() => copy.destroy()));
        } else {
          original(value);
        }
      };
    },
  };
}

/**
 * Load Pyodide with the project mounted and the SDK's runtime modules registered.
 * @returns {Promise<{pyodide: object, timings: object}>}
 */
export async function loadPythonRuntime({
  projectDir,
  cloudflareWorkersModule,
  compatFlags = {},
  stdout = (line) => process.stdout.write(line + "\n"),
  stderr = (line) => process.stderr.write(line + "\n"),
}) {
  const modules = path.join(projectDir, "python_modules");
  if (!existsSync(path.join(modules, "workers"))) {
    throw new Error(`${modules} has no vendored packages; run scripts/setup-runtime (or python3 scripts/vendor.py)`);
  }
  const started = performance.now();
  const pyodide = await loadPyodide({ stdout, stderr });
  const loaded = performance.now();

  mkdirSync(path.join(projectDir, ".cache", "pyodide-pycache"), { recursive: true });
  pyodide.FS.mkdirTree(PROJECT_MOUNT);
  pyodide.mountNodeFS(PROJECT_MOUNT, projectDir);
  pyodide.registerJsModule("_cloudflare_compat_flags", compatFlagsModule(compatFlags));
  pyodide.registerJsModule(
    "_pyodide_entrypoint_helper",
    entrypointHelperModule({ cloudflareWorkersModule, projectDir, pyodide }),
  );
  pyodide.runPython(`
import os, sys
sys.dont_write_bytecode = False
sys.pycache_prefix = "${PROJECT_MOUNT}/.cache/pyodide-pycache"
sys.path[0:0] = ["${PROJECT_MOUNT}/src", "${PROJECT_MOUNT}/python_modules", "${PROJECT_MOUNT}/runtime"]
os.chdir("${PROJECT_MOUNT}")
`);
  await pyodide.runPythonAsync("import workers, _workers_harness");
  const imported = performance.now();
  return {
    pyodide,
    timings: {
      loadPyodideMs: Math.round(loaded - started),
      importWorkersMs: Math.round(imported - loaded),
    },
  };
}
