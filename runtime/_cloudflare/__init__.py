"""The local runtime's `_cloudflare` package: what workerd provides under that name.

A Worker's module top level runs outside any request, and on workerd it may
not use entropy there (a deploy snapshots memory after the import, so any
random state would be shared by every instance). workerd installs a
`_cloudflare` package in site-packages that enforces this, and the workers
SDK's `.pth` file (`_workers_sdk_patch_loader`, processed under the
`python_process_pth_files` flag) registers its package patches with it.
This package is the local runtime's own implementation of that interface:

- `allow_entropy`: whether entropy may be used now, and
  `allow_bad_entropy_calls(n)` for imports known to need n calls;
- `import_patch_manager`: context managers run around chosen modules'
  import, `block_calls(module)` (its functions refuse to run until the first
  request), hooks for the first request;
- `top_level`: the standard-library rules (`os.urandom`, `random`, `_random`,
  `tempfile`) and the switch to request context.

runtime/pyodide-host.mjs copies it into Pyodide's site-packages, calls
`top_level.before_top_level()` before anything of the Worker is imported and
`top_level.before_first_request()` when the first event arrives. C-level
entropy (getentropy from extension modules) is counted on the JS side against
`allow_entropy`'s allowance.
"""
