// The offline dev server: the project's Python Worker over HTTP, on the local runtime.
//
//   node runtime/dev-server.mjs [--port 8787] [--ip 127.0.0.1] [--persist-to .wrangler/state]
//                               [--config wrangler.toml] [--dev-vars .dev.vars]
//                               [--request-timeout 30] [--agent src/agent.py]
//   (or scripts/dev / npm run dev, which set the runtime up first)
//   --request-timeout SECONDS (or DEV_REQUEST_TIMEOUT): for a request's headers, then
//   for its body; a request that takes longer gets a 408 and its connection is closed
//   --agent FILE: serve this Python file as the agent module (`agent`, which the
//   Worker's main imports) instead of src/agent.py, e.g. an agent under examples/
//   --config FILE: any Python Worker's wrangler.json, .jsonc or .toml (default: the first
//   found from the repo upward, as wrangler looks); main, migrations, .dev.vars and the
//   state dir are relative to it; another project's Worker is served without an agent
//   GET /__scheduled?cron=PATTERN[&time=MS]: runs the Worker's scheduled() handler
//
// What `wrangler dev` would do for a Python Worker if it could run offline:
// - reads the config (runtime/wrangler-config.mjs): `main`, `[vars]`, the D1 databases and Durable
//   Object bindings;
// - settings: `[vars]`, then `.dev.vars`, then process environment variables
//   of the same names, of the agent module's SETTINGS and DEV_STUBS, or of the
//   kit's own settings (API_TOKEN, MAX_BODY_BYTES, LLM_*); later wins.
//   API_TOKEN defaults to "dev-token". It learns the agent's names by
//   importing the agent module in the runtime, and prints the settings the
//   agent uses (values only from [vars]: never those of .dev.vars or the
//   environment, where secrets live);
// - each setting of the agent's DEV_STUBS that is empty points at
//   `<this server>/__dev/<NAME>`, and DEV_STUBS=on lets the Worker answer
//   there with the agent's stub (the server itself knows no stub);
// - D1 persists under `<persist-to>/v3/d1`, keyed by `preview_database_id`
//   or `database_id` as wrangler keys it, so `npx wrangler d1 execute <db>
//   --local` and `npx wrangler d1 migrations apply <db> --local` (with the
//   same `--persist-to`) see the same data; on start, wrangler itself applies
//   the migrations (while Pyodide loads);
// - CHAT_PAGE=on for the kit's Worker unless [vars], .dev.vars or the environment set it
//   (e.g. CHAT_PAGE=off): the Worker serves its chat page at /; `dev: chat page: <origin>/`
//   is printed after `ready on`;
// - answers stream as on workerd: the head as soon as the Worker returns its Response, then
//   each body chunk as the Worker's stream gives it (chunked; content-length only for a body
//   that is already complete), never compressed or held back; a client that goes away
//   mid-body cancels the Worker's body stream (a Durable Object writing to it sees its
//   writes fail and goes on); a body stream that errors cuts the connection short;
// - one log line per request; survives SIGKILL: everything durable is in D1,
//   and a workerd left behind by a killed server is stopped on the next start;
// - forwards every request the Worker can be given, and answers the others
//   itself, in the Worker's error shape `{"error": {"code", "message"}}`, with
//   nothing forwarded: TRACE and CONNECT (405: fetch cannot carry them), a
//   target that is not a path (`OPTIONS *`, `http://host/...`, `host:port`),
//   a method Node does not parse, or a malformed request (400), headers over
//   Node's 16 KiB (431), a declared Content-Length over 100 MiB (413,
//   before reading the body), headers or a body that do not arrive within
//   --request-timeout (408). The connection of a refused request is closed.

import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { PROJECT_MOUNT, startRuntime } from "./index.mjs";
import { ScheduledController } from "./durable-objects.mjs";
import { findWranglerConfig, readWorkerConfig, unservedMessage } from "./wrangler-config.mjs";

const PROJECT_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const DEV_TOKEN = "dev-token";
// The kit's own settings: read from the process environment even when neither [vars]
// nor .dev.vars name them (as are the agent module's SETTINGS and DEV_STUBS names).
const KIT_SETTINGS = [
  "API_TOKEN", "MAX_BODY_BYTES", "LLM_PROVIDER", "LLM_MODEL", "LLM_BASE_URL", "LLM_API_KEY", "CHAT_PAGE",
  "SESSION_TOKEN_SECRET", "MAX_SESSION_TOKENS", "RETENTION_DAYS", "SESSION_STORE",
];
const MAX_REQUEST_BYTES = 100 * 1024 * 1024; // Cloudflare's request body limit (free plan)
const DEFAULT_REQUEST_TIMEOUT_S = 30;
// fetch's forbidden methods: `new Request` throws for them, so no Worker can be given one.
const UNFORWARDABLE_METHODS = new Set(["CONNECT", "TRACE", "TRACK"]);
// The Allow of the dev server's own 405: the methods it forwards (the Worker answers for its routes).
const FORWARDED_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";
const HOP_BY_HOP = new Set(["connection", "keep-alive", "transfer-encoding", "upgrade", "expect"]);

function parseArgs(argv) {
  const options = {
    port: 8787,
    ip: "127.0.0.1",
    persistTo: null,
    config: null,
    devVars: null,
    requestTimeout: process.env.DEV_REQUEST_TIMEOUT || String(DEFAULT_REQUEST_TIMEOUT_S),
    agent: null,
  };
  const names = {
    "--port": "port",
    "--ip": "ip",
    "--persist-to": "persistTo",
    "--config": "config",
    "--dev-vars": "devVars",
    "--request-timeout": "requestTimeout",
    "--agent": "agent",
  };
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i].split(/=(.*)/s, 2);
    if (flag === "--help" || flag === "-h") {
      console.log(readFileSync(fileURLToPath(import.meta.url), "utf8").split("\n\n")[0].replaceAll(/^\/\/ ?/gm, ""));
      process.exit(0);
    }
    if (!(flag in names)) fail(`unknown option ${flag}; see --help`);
    const value = inline ?? argv[++i];
    if (value === undefined) fail(`${flag} needs a value`);
    options[names[flag]] = value;
  }
  options.port = Number(options.port);
  if (!Number.isInteger(options.port) || options.port < 0 || options.port > 65535) fail(`--port must be 0-65535`);
  const timeout = Number(options.requestTimeout);
  if (!(timeout > 0 && timeout <= 3600)) fail(`--request-timeout (DEV_REQUEST_TIMEOUT) must be over 0 and at most 3600 (seconds), got ${JSON.stringify(options.requestTimeout)}`);
  options.requestTimeoutMs = Math.round(timeout * 1000);
  // As wrangler finds it (wrangler.json, .jsonc, .toml, upward), or the file of --config;
  // .dev.vars beside it unless --dev-vars says otherwise.
  options.config = options.config === null ? findWranglerConfig(PROJECT_DIR) : path.resolve(PROJECT_DIR, options.config);
  if (!options.config) fail(`no wrangler.json, wrangler.jsonc or wrangler.toml in ${PROJECT_DIR} or above; pass --config`);
  // State beside the config by default, as wrangler dev keeps it (.wrangler/state of the project).
  options.persistTo = path.resolve(PROJECT_DIR, options.persistTo ?? path.join(path.dirname(options.config), ".wrangler", "state"));
  options.devVars = path.resolve(options.devVars === null ? path.dirname(options.config) : PROJECT_DIR, options.devVars ?? ".dev.vars");
  if (options.agent !== null) {
    options.agent = path.resolve(PROJECT_DIR, options.agent);
    if (!options.agent.endsWith(".py") || !existsSync(options.agent)) fail(`--agent: no Python file at ${options.agent}`);
  }
  return options;
}

function fail(message) {
  process.stderr.write(`dev: ${message}\n`);
  process.exit(1);
}

// .dev.vars is dotenv: KEY=value lines, # comments, optional quotes and `export`.
function readDevVars(file) {
  if (!file || !existsSync(file)) return {};
  const vars = {};
  for (const line of readFileSync(file, "utf8").split(/\r?\n/)) {
    const match = line.match(/^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$/);
    if (!match) continue;
    let value = match[2];
    const quoted = value.match(/^(["'])(.*)\1$/s);
    if (quoted) value = quoted[1] === '"' ? quoted[2].replaceAll("\\n", "\n") : quoted[2];
    else value = value.replace(/\s+#.*$/, "");
    vars[match[1]] = value;
  }
  return vars;
}

// The Worker's config (runtime/wrangler-config.mjs): paths relative to its directory.
// This kit's own Worker (main src/ or build/worker/, staged from src/) is served from
// src/; any other Worker from the directory of its main, in the config's directory.
function readConfig(file) {
  if (!existsSync(file)) fail(`${file} not found`);
  let config;
  try {
    config = readWorkerConfig(file);
  } catch (error) {
    fail(error.message);
  }
  const relativeMain = path.relative(config.projectDir, config.main).split(path.sep).join("/");
  const kitModule = config.projectDir === PROJECT_DIR && relativeMain.match(/^(?:src|build\/worker)\/(.+)\.py$/)?.[1];
  let workerDir = "src";
  let module = kitModule;
  if (!kitModule) {
    if (relativeMain.startsWith("../")) fail(`${file}: main ${relativeMain} is outside the config's directory`);
    if (!existsSync(config.main)) fail(`${file}: main ${relativeMain} not found`);
    workerDir = path.posix.dirname(relativeMain);
    module = path.posix.basename(relativeMain, ".py");
  }
  return {
    ...config,
    isKit: Boolean(kitModule),
    workerDir,
    module: module.replaceAll("/", "."),
    // What the runtime compiles as workerd does (and checks against its Pyodide).
    compatibility: {
      workerName: config.name,
      compatibilityDate: config.compatibilityDate,
      compatibilityFlags: config.compatibilityFlags,
    },
    databases: config.d1Databases,
  };
}

// The Worker's settings, later wins: [vars], .dev.vars, then the process environment for
// those names and `names`. `source[name]` says where each value came from.
function settingsFor(config, devVars, names) {
  const env = {};
  const source = {};
  for (const [from, values] of [["[vars]", config.vars], [".dev.vars", devVars]]) {
    for (const [name, value] of Object.entries(values)) {
      env[name] = value;
      source[name] = from;
    }
  }
  for (const name of new Set([...Object.keys(env), ...names])) {
    if (process.env[name] !== undefined) {
      env[name] = process.env[name];
      source[name] = "the environment";
    }
  }
  return { env, source };
}

const isEmpty = (value) => !String(value ?? "").trim();

// Import the agent module inside the runtime (the file of --agent as `agent`, or
// src/agent.py) and learn what it declares: {agent, settings, dev_stubs, make_llm}.
function describeAgent(runtime, agentFile) {
  let where = null;
  if (agentFile) {
    const relative = path.relative(PROJECT_DIR, agentFile);
    if (!relative.startsWith("..") && !path.isAbsolute(relative)) {
      where = `${PROJECT_MOUNT}/${relative.split(path.sep).join("/")}`;
    } else {
      const mount = "/agent-module";
      runtime.pyodide.FS.mkdirTree(mount);
      runtime.pyodide.mountNodeFS(mount, path.dirname(agentFile));
      where = `${mount}/${path.basename(agentFile)}`;
    }
  }
  const helper = runtime.importPython("_dev_agent");
  try {
    return JSON.parse(where === null ? helper.load() : helper.load(where));
  } finally {
    helper.destroy();
  }
}

// --- a workerd left behind by a SIGKILLed server holds the database open: stop it ---

function readProc(pid, file) {
  try {
    return readFileSync(`/proc/${pid}/${file}`, "utf8");
  } catch {
    return "";
  }
}

function isAlive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return error.code === "EPERM";
  }
}

function childWorkerdPids() {
  const pids = [];
  for (const entry of existsSync("/proc") ? readdirSync("/proc") : []) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = readProc(entry, "stat");
    const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    if (ppid === process.pid && readProc(entry, "cmdline").includes("workerd")) pids.push(Number(entry));
  }
  return pids;
}

async function claimStateDir(lockFile) {
  if (!existsSync(lockFile)) return;
  let previous;
  try {
    previous = JSON.parse(readFileSync(lockFile, "utf8"));
  } catch {
    return;
  }
  if (isAlive(previous.pid) && readProc(previous.pid, "cmdline").includes("dev-server.mjs")) {
    fail(`another dev server (pid ${previous.pid}) is using ${path.dirname(lockFile)}; stop it or pass --persist-to`);
  }
  for (const pid of previous.workerd ?? []) {
    if (isAlive(pid) && readProc(pid, "cmdline").includes("workerd")) {
      process.kill(pid, "SIGKILL");
      console.log(`dev: stopped workerd (pid ${pid}) left running by a dev server that was killed`);
      for (let i = 0; i < 50 && isAlive(pid); i++) await new Promise((r) => setTimeout(r, 20));
    }
  }
}

// --- migrations: wrangler's own command, so its d1_migrations table stays the record ---

function applyMigrations(options, database) {
  // A database without a migrations folder: nothing to apply (wrangler would fail on it).
  if (!existsSync(database.migrationsDir)) return Promise.resolve([]);
  const wrangler = path.join(PROJECT_DIR, "node_modules", ".bin", "wrangler");
  const args = ["d1", "migrations", "apply", database.name, "--local", "--persist-to", options.persistTo, "--config", options.config];
  return new Promise((resolve, reject) => {
    const child = spawn(wrangler, args, {
      cwd: PROJECT_DIR,
      env: { ...process.env, CI: "true", WRANGLER_SEND_METRICS: "false", NO_COLOR: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout.on("data", (chunk) => (output += chunk));
    child.stderr.on("data", (chunk) => (output += chunk));
    child.on("error", reject);
    child.on("close", (code) => {
      if (code !== 0) return reject(new Error(`wrangler ${args.join(" ")} failed (exit ${code}):\n${output}`));
      // wrangler redraws its table after each migration: each name once, in order.
      const applied = new Set([...output.matchAll(/│\s*(\S+\.sql)\s*│\s*✅/g)].map((m) => m[1]));
      resolve([...applied]);
    });
  });
}

// --- HTTP ---

// The body, within `timeoutMs` of the headers and MAX_REQUEST_BYTES: { body }, or
// { tooLarge }, { timedOut }, { aborted } (the client went away, or sent garbage).
function readBody(request, timeoutMs) {
  return new Promise((resolve) => {
    const chunks = [];
    let size = 0;
    let settled = false;
    const settle = (result) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      request.off("data", onData).off("end", onEnd).off("close", onClose);
      resolve(result);
    };
    const onData = (chunk) => {
      size += chunk.length;
      if (size > MAX_REQUEST_BYTES) settle({ tooLarge: true });
      else chunks.push(chunk);
    };
    const onEnd = () => settle({ body: Buffer.concat(chunks) });
    const onClose = () => settle(request.complete ? { body: Buffer.concat(chunks) } : { aborted: true });
    const timer = setTimeout(() => settle({ timedOut: true }), timeoutMs);
    request.on("data", onData).on("end", onEnd).on("close", onClose);
  });
}

function errorJson(code, message) {
  return JSON.stringify({ error: { code, message } });
}

function sendJson(response, status, body, headers = {}) {
  const payload = typeof body === "string" ? body : JSON.stringify(body);
  response
    .writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(payload), ...headers })
    .end(payload);
}

// An error answer for a request the dev server refuses: `connection: close` (Node then
// closes the socket once it is written), so no unread body is taken for the next request.
function sendError(response, status, code, message, headers = {}) {
  sendJson(response, status, errorJson(code, message), { ...headers, connection: "close" });
}

// The same on a bare socket (CONNECT, and requests Node's parser refused), then closed.
function writeError(socket, status, code, message, headers = {}) {
  const payload = errorJson(code, message);
  const head = [
    `HTTP/1.1 ${status} ${http.STATUS_CODES[status]}`,
    "content-type: application/json",
    `content-length: ${Buffer.byteLength(payload)}`,
    ...Object.entries(headers).map(([name, value]) => `${name}: ${value}`),
    "connection: close",
  ];
  socket.end(`${head.join("\r\n")}\r\n\r\n${payload}`, () => socket.destroy());
}

// What the dev server answers itself, before reading any of the body: [status, code, message, headers].
function refusal(request) {
  if (UNFORWARDABLE_METHODS.has(request.method)) {
    const message = `the dev server does not forward ${request.method} requests (fetch cannot carry them to a Worker)`;
    return [405, "method-not-allowed", message, { allow: FORWARDED_METHODS }];
  }
  if (!request.url.startsWith("/")) {
    const target = JSON.stringify(request.url.slice(0, 200));
    return [400, "invalid-request", `the request target must be a path starting with "/", got ${target}`];
  }
  const declared = request.headers["content-length"];
  if (declared !== undefined && Number(declared) > MAX_REQUEST_BYTES) {
    return [413, "body-too-large", `the declared Content-Length ${declared} is over 100 MiB`];
  }
  return null;
}

// Node's answer to a request its parser refused, or to headers that came too slowly; null: just close.
function clientErrorAnswer(error, timeoutMs) {
  if (error.code === "ERR_HTTP_REQUEST_TIMEOUT") {
    return [408, "request-timeout", `the request headers did not arrive within ${timeoutMs / 1000} s`];
  }
  if (error.code === "HPE_HEADER_OVERFLOW") return [431, "headers-too-large", "the request headers are too large"];
  if (String(error.code).startsWith("HPE_")) {
    return [400, "invalid-request", `malformed HTTP request: ${error.reason ?? error.message}`];
  }
  return null;
}

async function serve(whenReady, request, response, { origin, requestTimeoutMs, expectsContinue }) {
  const refused = refusal(request);
  if (refused) return sendError(response, ...refused);
  if (expectsContinue.has(request)) response.writeContinue();
  const read = await readBody(request, requestTimeoutMs);
  if (read.aborted) return;
  if (read.timedOut) {
    const message = `the request body did not arrive within ${requestTimeoutMs / 1000} s`;
    return sendError(response, 408, "request-timeout", message);
  }
  if (read.tooLarge) return sendError(response, 413, "body-too-large", "the body is over 100 MiB");
  const body = read.body;
  let jsRequest;
  try {
    const headers = new Headers();
    for (let i = 0; i < request.rawHeaders.length; i += 2) {
      const name = request.rawHeaders[i];
      if (!HOP_BY_HOP.has(name.toLowerCase())) headers.append(name, request.rawHeaders[i + 1]);
    }
    const hasBody = !["GET", "HEAD"].includes(request.method);
    jsRequest = new Request(origin + request.url, { method: request.method, headers, body: hasBody ? body : undefined });
  } catch (error) {
    return sendError(response, 400, "invalid-request", `the request cannot be given to the Worker: ${error?.message ?? error}`);
  }
  const worker = await whenReady;
  const scheduled = scheduledEvent(request);
  if (scheduled) return fireScheduled(worker, scheduled, response);
  let jsResponse;
  try {
    jsResponse = await worker.fetch(jsRequest);
  } catch (error) {
    process.stderr.write(`dev: the Worker threw: ${error?.stack ?? error}\n`);
    return sendJson(response, 500, { error: { code: "internal", message: String(error?.message ?? error).slice(0, 500) } });
  }
  return forward(request, response, jsResponse);
}

// The length of a body that is already complete: a Response built from a string, bytes,
// a Blob or JSON (undici's extractBody knows it); 0 without a body; null for a stream
// (sent chunked, as it comes).
function knownLength(jsResponse) {
  if (jsResponse.body === null) return 0;
  try {
    const state = Object.getOwnPropertySymbols(jsResponse).find((symbol) => symbol.description === "state");
    const length = state && jsResponse[state]?.body?.length;
    return Number.isSafeInteger(length) && length >= 0 ? length : null;
  } catch {
    return null;
  }
}

// Resolves once `response` can take more (or the client went away).
function drained(response) {
  return new Promise((resolve) => {
    const done = () => {
      response.off("drain", done).off("close", done);
      resolve();
    };
    response.on("drain", done).on("close", done);
  });
}

// The Worker's Response to the client, unbuffered, as workerd sends it: the head at once,
// then each chunk of the body as the Worker's stream gives it (chunked; content-length
// only for a body that is already complete). When the client goes away mid-body, the
// Worker's body is cancelled (as workerd cancels it: a Durable Object writing to it sees
// its writes fail, and goes on). Returns what happened: "sent", "gone" (the client went
// away) or "failed" (the Worker's stream errored: the connection is cut, no last chunk).
async function forward(request, response, jsResponse) {
  const body = jsResponse.body;
  const cancel = (reason) => body?.cancel(reason).catch(() => undefined);
  if (response.destroyed || request.socket.destroyed) {
    cancel(new Error("the client went away"));
    return "gone";
  }
  const status = jsResponse.status;
  const bodyless = request.method === "HEAD" || status === 204 || status === 304;
  const headers = {};
  for (const [name, value] of jsResponse.headers) {
    if (name === "content-length" || HOP_BY_HOP.has(name)) continue;
    // Only set-cookie repeats (Headers joins the others with ", ").
    if (name in headers) headers[name] = [headers[name], value].flat();
    else headers[name] = value;
  }
  const length = knownLength(jsResponse);
  if (length !== null && status !== 204 && status !== 304) headers["content-length"] = String(length);
  response.writeHead(status, headers);
  if (body === null || bodyless) {
    if (body !== null && !body.locked) cancel(new Error("a bodyless answer"));
    response.end();
    return "sent";
  }
  response.flushHeaders(); // the head now: the body may take minutes (an SSE stream)
  const reader = body.getReader();
  let gone = false;
  const onClose = () => {
    if (response.writableFinished) return;
    gone = true;
    reader.cancel(new Error("the client went away")).catch(() => undefined);
  };
  response.once("close", onClose);
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done || gone) break;
      if (!ArrayBuffer.isView(value) && !(value instanceof ArrayBuffer)) {
        throw new TypeError(
          `the Worker's response body gave a ${value?.constructor?.name ?? typeof value} chunk: ` +
            "a body stream must give bytes (an ArrayBuffer or a typed array), as workerd requires",
        );
      }
      // A copy: the view may be of memory the Worker reuses (Pyodide's heap).
      const chunk = ArrayBuffer.isView(value)
        ? Buffer.from(new Uint8Array(value.buffer, value.byteOffset, value.byteLength))
        : Buffer.from(new Uint8Array(value));
      if (chunk.length && !response.write(chunk)) await drained(response);
    }
  } catch (error) {
    if (gone) return "gone";
    process.stderr.write(`dev: the Worker's response body failed mid-way: ${error?.stack ?? error}\n`);
    reader.cancel(error).catch(() => undefined);
    response.destroy(); // no last chunk: the client sees the body cut short, as from workerd
    return "failed";
  } finally {
    response.off("close", onClose);
  }
  if (gone) return "gone";
  response.end();
  return "sent";
}

// --- cron: `wrangler dev --test-scheduled`'s GET /__scheduled?cron=...&time=..., and
// miniflare's /cdn-cgi/handler/scheduled: the Worker's scheduled() handler, answered
// "ok" (200) or "exception" (500) as miniflare answers ---

function scheduledEvent(request) {
  if (request.method !== "GET") return null;
  const url = new URL(request.url, "http://localhost");
  if (url.pathname !== "/__scheduled" && url.pathname !== "/cdn-cgi/handler/scheduled") return null;
  const time = url.searchParams.get("time");
  return { cron: url.searchParams.get("cron") ?? "", scheduledTime: time ? Number.parseInt(time, 10) : Date.now() };
}

async function fireScheduled(worker, event, response) {
  try {
    await worker.scheduled(new ScheduledController(event));
  } catch (error) {
    process.stderr.write(`dev: the Worker's scheduled handler threw: ${error?.stack ?? error}\n`);
    response.writeHead(500, { "content-type": "text/plain;charset=UTF-8" }).end("exception");
    return;
  }
  response.writeHead(200, { "content-type": "text/plain;charset=UTF-8" }).end("ok");
}

async function main() {
  const started = performance.now();
  const options = parseArgs(process.argv.slice(2));
  const config = readConfig(options.config);
  const devVars = readDevVars(options.devVars && path.resolve(PROJECT_DIR, options.devVars));
  const { env } = settingsFor(config, devVars, KIT_SETTINGS);
  mkdirSync(options.persistTo, { recursive: true });
  const lockFile = path.join(options.persistTo, "durable-agents-dev.json");
  await claimStateDir(lockFile);

  // Listen first: a busy port fails in milliseconds, and --port 0 gets its number before the Worker's env is set.
  const timeoutMs = options.requestTimeoutMs;
  const serverState = { origin: "", requestTimeoutMs: timeoutMs, expectsContinue: new WeakSet() };
  let ready;
  const whenReady = new Promise((resolve) => (ready = resolve));
  const inFlight = new WeakMap(); // socket -> the response being written on it
  const onRequest = async (request, response) => {
    const t0 = performance.now();
    const socket = request.socket;
    inFlight.set(socket, response);
    response.once("close", () => inFlight.get(socket) === response && inFlight.delete(socket));
    let outcome;
    try {
      outcome = await serve(whenReady, request, response, serverState);
    } catch (error) {
      process.stderr.write(`dev: ${error?.stack ?? error}\n`);
      if (!response.headersSent) sendJson(response, 500, { error: { code: "internal", message: "dev server error" } });
      else response.destroy();
    }
    const status = response.headersSent ? response.statusCode : "- (the client went away)";
    const after = !response.headersSent
      ? ""
      : outcome === "gone"
        ? " - (the client went away mid-body)"
        : outcome === "failed"
          ? " - (the Worker's body failed mid-way)"
          : "";
    console.log(`${request.method} ${request.url} ${status} ${Math.round(performance.now() - t0)}ms${after}`);
  };
  const server = http.createServer(
    {
      // Headers within the timeout (Node's check, every connectionsCheckingInterval); the
      // body is timed by readBody. Nothing times the answer: a turn may take minutes.
      headersTimeout: timeoutMs,
      requestTimeout: 0,
      noDelay: true, // each chunk of a streamed body goes out as it comes (no Nagle delay)
      connectionsCheckingInterval: Math.min(30_000, Math.max(50, Math.round(timeoutMs / 5))),
    },
    onRequest,
  );
  server.keepAliveTimeout = 5000;
  // Expect: 100-continue: the checks run before the client is told to send its body.
  server.on("checkContinue", (request, response) => {
    serverState.expectsContinue.add(request);
    onRequest(request, response);
  });
  // CONNECT has no 'request' event (Node hands the socket over): refuse it here.
  server.on("connect", (request, socket) => {
    const message = "the dev server does not forward CONNECT requests (fetch cannot carry them to a Worker)";
    writeError(socket, 405, "method-not-allowed", message, { allow: FORWARDED_METHODS });
    console.log(`CONNECT ${request.url} 405 0ms`);
  });
  // What Node's parser refuses (a malformed request line or header, an authority-form
  // target, an unknown method) and headers that did not arrive in time.
  server.on("clientError", (error, socket) => {
    const answer = clientErrorAnswer(error, timeoutMs);
    if (answer && socket.writable && !inFlight.get(socket)?.headersSent) {
      writeError(socket, ...answer);
      if (socket.bytesRead > 0) console.log(`dev: refused a request (${answer[0]}): ${answer[2]}`);
    } else {
      socket.destroy();
    }
  });
  await new Promise((resolve) => {
    server.once("error", (error) => fail(error.code === "EADDRINUSE" ? `port ${options.port} is in use; pass --port` : String(error)));
    server.listen(options.port, options.ip, resolve);
  });
  const { port } = server.address();
  const host = options.ip.includes(":") ? `[${options.ip}]` : options.ip;
  const origin = `http://${host}:${port}`;
  serverState.origin = origin;

  let migrationsMs = 0;
  const applied = [];
  const runtime = await startRuntime({
    ...config.compatibility,
    persist: options.persistTo,
    d1Databases: Object.fromEntries(config.databases.map((db) => [db.binding, db.localId])),
    kvNamespaces: Object.fromEntries(config.kvNamespaces.map((kv) => [kv.binding, kv.id])),
    unservedBindings: config.unserved,
    projectDir: config.projectDir,
    workerDir: config.workerDir,
    vars: env,
    beforeD1: async () => {
      const t = performance.now();
      for (const db of config.databases) if (db.name) applied.push(...(await applyMigrations(options, db)));
      migrationsMs = Math.round(performance.now() - t);
    },
  });
  const tWorker = performance.now();
  // Another project's Worker (--config elsewhere) has no agent module: its settings as they are.
  const servesAgent = config.isKit || options.agent !== null;
  const agent = servesAgent ? describeAgent(runtime, options.agent) : null;
  const notes = servesAgent
    ? settle(runtime.env, config, devVars, agent, origin, options.agent)
    : [`serving the Worker ${shownPath(config.main)} (${shownPath(config.file)})`];
  for (const binding of config.unserved) notes.push(unservedMessage(binding));
  if (config.crons.length) notes.push(`cron triggers ${config.crons.join(", ")}: fire one with GET ${origin}/__scheduled?cron=<pattern>`);
  const worker = runtime.loadWorker({ main: config.module, durableObjects: config.durableObjects });
  const workerMs = Math.round(performance.now() - tWorker);
  writeFileSync(lockFile, JSON.stringify({ pid: process.pid, workerd: childWorkerdPids() }) + "\n");

  // Ctrl-C / SIGTERM: miniflare's own exit hook stops workerd and exits (130 / 143);
  // the lock goes with the process. After a SIGKILL the next start cleans up instead.
  process.on("exit", () => rmSync(lockFile, { force: true }));
  for (const [signal, code] of [["SIGINT", 130], ["SIGTERM", 143]]) {
    if (process.listenerCount(signal) === 0) process.on(signal, () => process.exit(code));
  }

  const t = runtime.timings;
  for (const note of notes) console.log(`dev: ${note}`);
  const stateDir = path.relative(PROJECT_DIR, options.persistTo);
  const shown = stateDir && !stateDir.startsWith("..") ? stateDir : options.persistTo;
  if (config.databases.length) {
    console.log(`dev: D1 in ${shown}/v3/d1; migrations ${applied.length ? `applied: ${applied.join(", ")}` : "up to date"}`);
  }
  console.log(
    `dev: started in ${Math.round(performance.now() - started)} ms (Pyodide ${t.loadPyodideMs} ms, ` +
      `workers SDK ${t.importWorkersMs} ms, migrations ${migrationsMs} ms, D1 ${t.miniflareMs} ms, ` +
      `Worker module and agent ${workerMs} ms)`,
  );
  ready(worker);
  console.log(`ready on ${origin}`);
  if (servesAgent && runtime.env.CHAT_PAGE === "on") console.log(`dev: chat page: ${origin}/`);
}

// A path relative to this repo when it is in it, else absolute.
function shownPath(file) {
  const relative = path.relative(PROJECT_DIR, file);
  return relative && !relative.startsWith("..") && !path.isAbsolute(relative) ? relative : file;
}

// The agent's settings into the Worker's env (from the environment too), its dev stubs
// wired for those left empty, the dev token; the lines to print about them.
function settle(workerEnv, config, devVars, agent, origin, agentFile) {
  const { env, source } = settingsFor(config, devVars, [...KIT_SETTINGS, ...agent.settings, ...agent.dev_stubs]);
  const notes = [];
  const relative = agentFile && path.relative(PROJECT_DIR, agentFile);
  const shown = !agentFile ? "src/agent.py" : relative.startsWith("..") ? agentFile : relative;
  notes.push(`serving the agent ${JSON.stringify(agent.agent)} from ${shown}`);
  if (!env.API_TOKEN) {
    env.API_TOKEN = DEV_TOKEN;
    notes.push(`API_TOKEN is not set: using the dev token "${DEV_TOKEN}" (Authorization: Bearer ${DEV_TOKEN})`);
  }
  // The chat page at / (the Worker serves it when CHAT_PAGE is "on"): on unless set.
  if (isEmpty(env.CHAT_PAGE)) env.CHAT_PAGE = "on";
  const stubbed = agent.dev_stubs.filter((name) => isEmpty(env[name]));
  for (const name of stubbed) env[name] = `${origin}/__dev/${name}`;
  if (stubbed.length) env.DEV_STUBS = "on";
  for (const name of new Set([...agent.settings, ...agent.dev_stubs])) {
    if (stubbed.includes(name)) notes.push(`${name} is not set: using the agent's dev stub ${env[name]}`);
    else if (isEmpty(env[name])) notes.push(`${name} is not set`);
    else if (source[name] === "[vars]") notes.push(`${name}=${env[name]} (from [vars])`);
    else notes.push(`${name} is set (from ${source[name]}; not printed)`);
  }
  const provider = String(env.LLM_PROVIDER ?? "").trim() || (env.LLM_API_KEY ? "(unset)" : "demo");
  const at = provider !== "demo" && env.LLM_BASE_URL ? ` at ${env.LLM_BASE_URL}` : "";
  const model = agent.make_llm
    ? " (the agent's make_llm builds the model)"
    : provider === "demo"
      ? " (offline: TestLLM, which calls each tool once)"
      : "";
  notes.push(`LLM_PROVIDER=${provider}${at}${model}`);
  Object.assign(workerEnv, env);
  return notes;
}

main().catch((error) => {
  process.stderr.write(`dev: could not start: ${error?.stack ?? error}\n`);
  process.exit(1);
});
