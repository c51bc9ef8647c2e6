// KV namespaces for the local runtime: miniflare's own KV (the engine `wrangler dev`
// uses), reached through miniflare's binding proxy, persisted under
// `<persist>/v3/kv` as `wrangler dev` persists it (so `wrangler kv key ... --local`
// with the same --persist-to sees the same data).
//
// The class is named `KvNamespace`, workerd's name: the workers SDK wraps a binding
// of that name in its `_BindingWrapper` (arguments and results converted).

export class KvNamespace {
  #binding;

  constructor(binding) {
    this.#binding = binding;
  }

  get(key, options) {
    return this.#binding.get(key, options);
  }

  getWithMetadata(key, options) {
    return this.#binding.getWithMetadata(key, options);
  }

  put(key, value, options) {
    return this.#binding.put(key, value, options);
  }

  delete(key) {
    return this.#binding.delete(key);
  }

  list(options) {
    return this.#binding.list(options);
  }
}

/** `env.<binding>` for each KV namespace of a started miniflare. */
export async function kvBindings(miniflare, bindings) {
  const env = {};
  for (const binding of bindings) env[binding] = new KvNamespace(await miniflare.getKVNamespace(binding));
  return env;
}
