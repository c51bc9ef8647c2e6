// Durable Objects and Worker entrypoints for the local runtime, driven the way workerd drives Python.
//
// The workers SDK does not convert handler arguments or results itself; the
// runtime does. For every event this module does what workerd does for a
// Python class: the Worker entrypoint gets a NEW instance per request, built
// with the raw JS ctx and env (the SDK's class wrapper then wraps env in
// `_EnvWrapper`, and ctx in `DurableObjectContext` for Durable Objects);
// each argument goes through `workers.python_from_rpc` (a JS `Request`
// becomes `workers.Request`) and the result through `workers.python_to_rpc`
// (a `workers.Response` becomes its JS `Response`). That glue lives in
// `_workers_harness.py`.
//
// A Durable Object id maps to ONE live instance for the life of the runtime.
// Concurrency follows workerd's input gates rather than a strict queue:
// events start in arrival order, one at a time, and may interleave while a
// handler awaits I/O (D1, fetch), except while `ctx.blockConcurrencyWhile()`
// runs. A strict queue would deadlock an object that calls itself, and would
// hide races that production has (two requests on one object awaiting D1).
// `ctx.storage` is SQLite-backed storage (runtime/storage.mjs), one database per
// object. Local simplifications: no alarms, no hibernation or eviction, and RPC values are passed by reference instead of
// being structured-cloned.
//
// Ids are derived as workerd derives them (server/actor-id-impl.c++), from
// the namespace's unique key: key = SHA-256(uniqueKey); an id is 16 bytes
// (idFromName: HMAC-SHA256(key, name), truncated; newUniqueId: random)
// followed by the first 16 bytes of HMAC-SHA256(key, those 16 bytes), as 64
// hex chars. idFromString() checks that second half, so an id of another
// namespace is refused. The runtime uses `wrangler dev`'s unique key,
// "<worker name>-<class name>", so ids match `wrangler dev`'s; Cloudflare's
// own namespaces have secret keys, so production ids differ.

import { AsyncLocalStorage } from "node:async_hooks";
import { createHash, createHmac, randomBytes } from "node:crypto";
import { DurableObjectStorage, storageFile } from "./storage.mjs";

const ID_HALF = 16;

// --- the output gate ---
//
// workerd holds every outgoing message of a Durable Object (its fetch()
// subrequests, its calls to other objects, its response) while that object's
// storage writes are not yet confirmed durable, and drops them with an error
// if a write fails (then the object is reset). Here: the object whose event is
// running is tracked with an AsyncLocalStorage (entered when an event is
// delivered; Pyodide schedules each asyncio step with setImmediate, which
// carries it), its writes join an implicit transaction committed at the next
// macrotask (runtime/storage.mjs), and an outgoing message waits for that commit.
const currentObject = new AsyncLocalStorage();

/**
 * Run `send` once the storage writes of `object` (default: the object whose
 * event is running) are durable: at once (synchronously) when none are
 * pending, so an ungated message keeps its order; rejected if a write failed.
 */
export function throughOutputGate(send, object = currentObject.getStore()) {
  const pending = object?.storageApi?.pendingDurability();
  return pending ? pending.then(send) : send();
}

let installedFetch = null;

/**
 * Make the global `fetch` (what Python's `js.fetch` and `workers.fetch` call) pass
 * the output gate of the object whose event calls it. Idempotent.
 */
export function installOutputGate() {
  if (installedFetch !== null) return;
  const realFetch = globalThis.fetch;
  installedFetch = function fetch(input, init) {
    const object = currentObject.getStore();
    if (!object?.storageApi?.pendingDurability()) return realFetch(input, init);
    // Read the request now, as workerd does, but let it leave only once the writes are durable.
    const request = new Request(input, init);
    return throughOutputGate(() => realFetch(request), object);
  };
  globalThis.fetch = installedFetch;
}

/** A Durable Object id: 64 hex chars; `name` is set when made by `idFromName`. */
export class DurableObjectId {
  #hex;
  #name;

  constructor(hex, name) {
    this.#hex = hex;
    this.#name = name;
  }

  get name() {
    return this.#name;
  }

  toString() {
    return this.#hex;
  }

  equals(other) {
    return other instanceof DurableObjectId && other.toString() === this.#hex;
  }
}

/** Records `waitUntil` promises so a caller (a test, the dev server) can wait for them. */
export class BackgroundTasks {
  #pending = new Set();
  #onError;

  constructor(onError) {
    this.#onError = onError;
  }

  add(promise) {
    const task = Promise.resolve(promise).catch((error) => this.#onError(error));
    this.#pending.add(task);
    task.finally(() => this.#pending.delete(task));
  }

  async drain() {
    while (this.#pending.size > 0) await Promise.allSettled([...this.#pending]);
  }
}

/** The `ctx` of one Worker request; its toString tag is what the SDK's patchWaitUntil checks. */
export class ExecutionContext {
  #tasks;

  constructor(tasks) {
    this.#tasks = tasks;
    this.props = {};
  }

  get [Symbol.toStringTag]() {
    return "ExecutionContext";
  }

  waitUntil(promise) {
    this.#tasks.add(promise);
  }

  passThroughOnException() {}
}

/** What a `scheduled` handler gets, as on workerd: the cron pattern and the time it fired for (ms). */
export class ScheduledController {
  constructor({ cron = "", scheduledTime = Date.now() } = {}) {
    this.cron = cron;
    this.scheduledTime = scheduledTime;
  }

  noRetry() {}
}

/** The `ctx` of a Durable Object (`self.ctx` in Python, wrapped in the SDK's DurableObjectContext). */
export class DurableObjectState {
  #object;

  constructor(object, id) {
    this.#object = object;
    this.id = id;
  }

  get [Symbol.toStringTag]() {
    return "DurableObjectState";
  }

  /** The object's SQLite-backed storage (runtime/storage.mjs), opened on first use. */
  get storage() {
    return this.#object.storage();
  }

  waitUntil(promise) {
    this.#object.tasks.add(promise);
  }

  blockConcurrencyWhile(callback) {
    return this.#object.blockConcurrencyWhile(callback);
  }

  abort(reason) {
    this.#object.abort(reason);
  }
}

// One live object: its Python instance, its input gate, its event order.
class LiveObject {
  constructor(namespace, id) {
    this.namespace = namespace;
    this.id = id;
    this.tasks = namespace.host.tasks;
    this.state = new DurableObjectState(this, id);
    this.instance = null;
    // Events start in arrival order: each waits for its predecessor to
    // START (not finish), and for any blockConcurrencyWhile() in progress.
    this.startChain = Promise.resolve();
    this.gate = Promise.resolve();
    this.storageApi = null;
    // Bumped when a failed write resets the object: events of the old instance fail.
    this.generation = 0;
    this.brokenBy = null;
  }

  storage() {
    this.storageApi ??= new DurableObjectStorage(
      storageFile(this.namespace.host.storageRoot, this.namespace.uniqueKey, this.id.toString()),
      { onFailure: (error) => this.reset(error) },
    );
    return this.storageApi;
  }

  // A storage write failed (workerd breaks the object): the next event gets a fresh instance.
  reset(error) {
    this.instance?.destroy?.();
    this.instance = null;
    this.generation += 1;
    this.brokenBy = error;
    this.namespace.host.log?.(`Durable Object ${this.id} reset: ${error.message}`);
  }

  blockConcurrencyWhile(callback) {
    const run = (async () => callback())();
    this.gate = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  // The SDK calls this from a microtask after raising DurableObjectAbort in
  // Python; like workerd, the next event gets a fresh instance.
  abort(reason) {
    this.instance?.destroy?.();
    this.instance = null;
    this.namespace.host.log?.(`Durable Object ${this.id} aborted${reason ? `: ${reason}` : ""}`);
  }

  deliver(handler) {
    const started = this.startChain.then(async () => {
      await this.gate;
      if (this.instance === null) {
        this.namespace.host.beginRequests?.();
        this.instance = this.namespace.host.instantiate(this.namespace.pythonClass, this.state, this.namespace.host.env);
        await this.gate; // the constructor may have called blockConcurrencyWhile()
      }
    });
    this.startChain = started.catch(() => undefined);
    // The event runs as this object's (for the output gate); its answer, or its
    // error, leaves only once the writes it made are durable.
    // An event of an instance that a failed write reset ends in that failure.
    return started.then(() => {
      const generation = this.generation;
      const settle = (send) => () => {
        if (this.generation !== generation) throw this.brokenBy;
        return send();
      };
      return currentObject.run(this, () =>
        Promise.resolve(handler(this.instance)).then(
          (result) => throughOutputGate(settle(() => result), this),
          (error) =>
            throughOutputGate(
              settle(() => {
                throw error;
              }),
              this,
            ),
        ),
      );
    });
  }
}

// What crosses an RPC boundary is a serialized error: a plain Error with the
// message (for a Python exception, its traceback), never the PythonError.
function asRpcError(error) {
  if (!(error instanceof Error)) return new Error(String(error));
  const copy = new Error(error.message);
  copy.name = error.name === "PythonError" ? "Error" : error.name;
  return copy;
}

function stubFor(object) {
  const base = {
    id: object.id,
    name: object.id.name,
    fetch(input, init) {
      const request = new Request(input, init);
      return Promise.resolve(
        throughOutputGate(() => object.deliver((instance) => object.namespace.host.invoke(instance, "fetch", [request]))),
      ).catch((error) => {
        throw asRpcError(error);
      });
    },
  };
  // Any other property is an RPC method, as on a workerd stub. `then` must
  // stay undefined or the stub would look like a promise.
  return new Proxy(base, {
    get(target, property) {
      if (property in target || typeof property !== "string" || property === "then") return target[property];
      return (...args) =>
        Promise.resolve(
          throughOutputGate(() => object.deliver((instance) => object.namespace.host.invoke(instance, property, args))),
        ).catch((error) => {
          throw asRpcError(error);
        });
    },
  });
}

/** `env.MY_DO`: ids by name, stubs by id; one live instance per id. */
export class DurableObjectNamespace {
  #objects = new Map();
  #key;

  /**
   * @param {object} host what runs Python: {instantiate(cls, ctx, env), invoke(instance, method, args),
   *   beginRequests(), tasks, env}
   * @param {object} pythonClass the Durable Object class (a PyProxy)
   * @param {string} className its name
   * @param {string} [uniqueKey] the namespace's unique key, which every id derives from
   */
  constructor(host, pythonClass, className, uniqueKey = className) {
    this.host = host;
    this.pythonClass = pythonClass;
    this.className = className;
    this.uniqueKey = uniqueKey;
    this.#key = createHash("sha256").update(uniqueKey).digest();
  }

  // The second half of an id: the first 16 bytes of HMAC(key, first half).
  #mac(firstHalf) {
    return createHmac("sha256", this.#key).update(firstHalf).digest().subarray(0, ID_HALF);
  }

  idFromName(name) {
    name = String(name);
    const firstHalf = createHmac("sha256", this.#key).update(name, "utf8").digest().subarray(0, ID_HALF);
    return new DurableObjectId(Buffer.concat([firstHalf, this.#mac(firstHalf)]).toString("hex"), name);
  }

  idFromString(hex) {
    hex = String(hex);
    if (!/^[0-9a-fA-F]{64}$/.test(hex)) throw new TypeError("Invalid Durable Object ID: must be 64 hex digits");
    const bytes = Buffer.from(hex, "hex");
    if (!this.#mac(bytes.subarray(0, ID_HALF)).equals(bytes.subarray(ID_HALF))) {
      throw new TypeError("Durable Object ID is not valid for this namespace.");
    }
    hex = hex.toLowerCase();
    const known = this.#objects.get(hex);
    return known ? known.id : new DurableObjectId(hex, undefined);
  }

  newUniqueId() {
    const firstHalf = randomBytes(ID_HALF);
    return new DurableObjectId(Buffer.concat([firstHalf, this.#mac(firstHalf)]).toString("hex"), undefined);
  }

  get(id) {
    if (!(id instanceof DurableObjectId)) throw new TypeError("get() takes a DurableObjectId");
    let object = this.#objects.get(id.toString());
    if (!object) {
      object = new LiveObject(this, id);
      this.#objects.set(id.toString(), object);
    }
    return stubFor(object);
  }

  getByName(name) {
    return this.get(this.idFromName(name));
  }

  jurisdiction() {
    return this;
  }

  /** Harness only: destroy every live instance's Python proxy. */
  dispose() {
    for (const object of this.#objects.values()) {
      object.instance?.destroy?.();
      object.storageApi?.close();
    }
    this.#objects.clear();
  }
}

/**
 * A Python `WorkerEntrypoint` class served the way workerd serves it: a new
 * instance per request, with a fresh ExecutionContext.
 */
export function workerEntrypoint(host, pythonClass) {
  async function call(method, args) {
    host.beginRequests?.();
    const ctx = new ExecutionContext(host.tasks);
    const instance = host.instantiate(pythonClass, ctx, host.env);
    try {
      return await host.invoke(instance, method, args);
    } finally {
      instance.destroy();
    }
  }
  return {
    fetch: (request) => call("fetch", [request]),
    // A cron event: `controller` is a ScheduledController ({cron, scheduledTime, noRetry()}).
    scheduled: (controller) => call("scheduled", [controller]),
    call,
  };
}
