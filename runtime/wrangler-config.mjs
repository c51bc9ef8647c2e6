// A Worker's wrangler config, found and read as wrangler reads it, for the local runtime.
//
// - Found as wrangler 4 finds it (findWranglerConfig): `wrangler.json`, else
//   `wrangler.jsonc`, else `wrangler.toml`, each looked for in the directory and
//   then in every directory above it (so a wrangler.json above beats a
//   wrangler.toml beside).
// - `.json` and `.jsonc` are read as JSONC (comments and trailing commas, as
//   wrangler's jsonc-parser allows), `.toml` as TOML.
// - Paths in it (`main`, a D1 database's `migrations_dir`) are relative to the
//   config file's directory, as in wrangler; so is `.dev.vars`.
// - Every binding is sorted into what the local runtime serves (vars, D1,
//   Durable Objects, KV) and what it does not (R2, Queues, services, AI, ...),
//   which the caller names at start.
//
//   node runtime/wrangler-config.mjs [DIR | FILE]     the config read, as JSON

import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parse as parseToml } from "smol-toml";

export const CONFIG_NAMES = ["wrangler.json", "wrangler.jsonc", "wrangler.toml"];

/** The file of `name` in `dir` or the nearest directory above it, or null. */
function findUp(name, dir) {
  for (let current = path.resolve(dir); ; current = path.dirname(current)) {
    const candidate = path.join(current, name);
    if (existsSync(candidate)) return candidate;
    if (path.dirname(current) === current) return null;
  }
}

/** The config wrangler would use from `dir`: wrangler.json, then .jsonc, then .toml, each found upward. */
export function findWranglerConfig(dir = process.cwd()) {
  for (const name of CONFIG_NAMES) {
    const found = findUp(name, dir);
    if (found) return found;
  }
  return null;
}

/**
 * Parse JSONC: JSON with // and /* *\/ comments and trailing commas (what wrangler
 * accepts in wrangler.json and wrangler.jsonc). Comments and trailing commas are
 * blanked outside strings, then JSON.parse reads the rest, so errors keep their positions.
 */
export function parseJsonc(text) {
  let out = "";
  let i = 0;
  const n = text.length;
  if (text.charCodeAt(0) === 0xfeff) i = 1;
  while (i < n) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (j < n && text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j + 1;
    } else if (c === "/" && text[i + 1] === "/") {
      let j = i;
      while (j < n && text[j] !== "\n") j++;
      out += " ".repeat(j - i);
      i = j;
    } else if (c === "/" && text[i + 1] === "*") {
      const end = text.indexOf("*/", i + 2);
      if (end === -1) throw new SyntaxError("unterminated /* comment in JSONC");
      out += text.slice(i, end + 2).replace(/[^\n]/g, " ");
      i = end + 2;
    } else if (c === ",") {
      // A trailing comma: only whitespace and comments before the closing bracket.
      let j = i + 1;
      for (;;) {
        while (j < n && /\s/.test(text[j])) j++;
        if (text[j] === "/" && text[j + 1] === "/") {
          while (j < n && text[j] !== "\n") j++;
        } else if (text[j] === "/" && text[j + 1] === "*") {
          const end = text.indexOf("*/", j + 2);
          j = end === -1 ? n : end + 2;
        } else break;
      }
      out += text[j] === "}" || text[j] === "]" ? " " : ",";
      i += 1;
    } else {
      out += c;
      i += 1;
    }
  }
  return JSON.parse(out);
}

/** The raw config object of a wrangler.toml / .json / .jsonc file. */
export function parseConfigFile(file) {
  const text = readFileSync(file, "utf8");
  try {
    return file.endsWith(".toml") ? parseToml(text) : parseJsonc(text);
  } catch (error) {
    throw new Error(`${file}: ${error.message}`);
  }
}

// Bindings the local runtime does not serve: config key -> what it is.
export const UNSERVED_BINDINGS = {
  r2_buckets: "R2 bucket",
  queues: "Queue",
  services: "service binding",
  ai: "Workers AI",
  vectorize: "Vectorize index",
  analytics_engine_datasets: "Analytics Engine dataset",
  hyperdrive: "Hyperdrive",
  browser: "Browser Rendering",
  images: "Images",
  workflows: "Workflow",
  send_email: "send_email",
  mtls_certificates: "mTLS certificate",
  dispatch_namespaces: "dispatch namespace",
  ratelimits: "rate limiter",
  version_metadata: "version metadata",
  secrets_store_secrets: "Secrets Store secret",
  pipelines: "Pipeline",
  assets: "static assets",
  unsafe: "unsafe binding",
};

// The binding names of one unserved config key (its shapes differ: a table, a list of tables).
function unservedNames(key, value) {
  if (key === "queues") return (value.producers ?? []).map((q) => q.binding);
  const entries = Array.isArray(value) ? value : [value];
  return entries.map((entry) => entry?.binding ?? entry?.name ?? null);
}

/**
 * Read a Worker's config: the file, its directory (the project), `main` and the
 * Worker's module root, compatibility, vars, what is served and what is not.
 */
export function readWorkerConfig(file) {
  file = path.resolve(file);
  if (!existsSync(file)) throw new Error(`${file} not found`);
  const config = parseConfigFile(file);
  const projectDir = path.dirname(file);
  if (!config.main) throw new Error(`${file}: no "main" (the Worker's Python module)`);
  const main = path.resolve(projectDir, String(config.main));
  if (!main.endsWith(".py")) throw new Error(`${file}: main must be a Python file (.py), got ${JSON.stringify(config.main)}`);
  const unserved = [];
  for (const [key, kind] of Object.entries(UNSERVED_BINDINGS)) {
    if (config[key] === undefined) continue;
    const names = unservedNames(key, config[key]);
    for (const name of names.length ? names : [null]) unserved.push({ key, kind, binding: name });
  }
  const queueConsumers = config.queues?.consumers ?? [];
  if (queueConsumers.length) unserved.push({ key: "queues", kind: "Queue consumer", binding: null });
  return {
    file,
    projectDir,
    name: config.name ?? "",
    main,
    compatibilityDate: config.compatibility_date,
    compatibilityFlags: config.compatibility_flags ?? [],
    vars: { ...(config.vars ?? {}) },
    d1Databases: (config.d1_databases ?? []).map((db) => ({
      binding: db.binding,
      name: db.database_name,
      // The id wrangler's `d1 ... --local` keys local data by.
      localId: db.preview_database_id ?? db.database_id ?? db.binding,
      migrationsDir: path.resolve(projectDir, db.migrations_dir ?? "migrations"),
    })),
    durableObjects: Object.fromEntries((config.durable_objects?.bindings ?? []).map((b) => [b.name, b.class_name])),
    kvNamespaces: (config.kv_namespaces ?? []).map((kv) => ({ binding: kv.binding, id: kv.preview_id ?? kv.id ?? kv.binding })),
    crons: config.triggers?.crons ?? [],
    unserved,
  };
}

/** What the local runtime says at start about a binding it does not serve. */
export function unservedMessage({ key, kind, binding }) {
  const what = binding ? `${kind} binding ${binding}` : kind;
  return `${what} ([${key}]) is not served by the local runtime: the Worker starts without it${binding ? `, and env.${binding} raises when used` : ""}`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const target = process.argv[2] ?? process.cwd();
  const file = target.match(/\.(toml|json|jsonc)$/) ? target : findWranglerConfig(target);
  if (!file) {
    process.stderr.write(`no wrangler.json, wrangler.jsonc or wrangler.toml in ${target} or above\n`);
    process.exit(1);
  }
  console.log(JSON.stringify(readWorkerConfig(file), null, 2));
}
