"""workerd's rules, as the local runtime applies them, seen from inside a request.

These run in the shared test runtime, which has already served its first
event: the top-level side of the rules (entropy refused, the frozen clock, a
Worker that fails to start) and what a Worker's `sys.path` holds need a fresh
runtime with a throwaway Worker, and are tested from CPython in
tests/test_runtime_target.py. The test runner adds its own entries to
`sys.path` for the tests' imports; a Worker's path has none of them.
"""

import hashlib
import hmac
import importlib.util
import os
import random
import sys
import time
import tomllib
import uuid

import _cloudflare_compat_flags
import _local_runtime
import _pyodide_entrypoint_helper
import workers
from workers import DurableObject, Response

with open("/project/wrangler.toml", "rb") as config_file:
    CONFIG = tomllib.load(config_file)


def test_entropy_and_the_clock_work_inside_a_request():
    assert 0 <= random.random() < 1
    assert random.Random().random() != random.Random().random()
    assert len(os.urandom(8)) == 8
    assert uuid.uuid4() != uuid.uuid4()
    assert time.time() > 1.7e9


def test_sys_path_order_is_workerds():
    # The test runner puts its own entries (pyproject's pytest `pythonpath`) in front.
    workerd_part = sys.path[sys.path.index("/lib/python314.zip") :]
    assert workerd_part == [
        "/lib/python314.zip",
        "/lib/python3.14/lib-dynload",
        "/project/python_modules",
        "/lib/python3.14/site-packages",
        "/project/src",
    ]
    for name in ("_workers_harness", "_runtime_tests", "_dev_agent"):
        assert importlib.util.find_spec(name) is None, name
    assert importlib.util.find_spec("_cloudflare") is not None  # installed as on workerd


def test_pth_files_were_processed():
    assert "_workers_sdk_patch_loader" in sys.modules
    assert "_workers_sdk_entropy_import_context" in sys.modules
    assert "_workers_sdk_package_patches" in sys.modules


def test_compat_flags_module_follows_the_config():
    flags = _cloudflare_compat_flags
    assert CONFIG["compatibility_flags"] == [
        "python_workers",
        "durable_object_io_tasks_prevent_eviction",
    ]
    assert flags.python_workers is True
    assert flags.durable_object_io_tasks_prevent_eviction is True
    assert flags.python_workers_314 is True  # implied from 2026-09-08
    assert flags.python_workers_20260610 is False
    assert flags.python_process_pth_files is True
    assert flags.python_request_headers_preserve_commas is True
    assert flags.nodejs_compat is True  # on by date from 2026-08-04
    assert flags.experimental is False
    assert not hasattr(flags, "python_something_else")  # an unknown name raises AttributeError
    assert getattr(flags, "python_something_else", "default") == "default"


def test_entrypoint_helper_has_workerds_members_only():
    helper = _pyodide_entrypoint_helper
    for name in (
        "doAnImport",
        "cloudflareWorkersModule",
        "cloudflareSocketsModule",
        "workerEntrypoint",
        "patchWaitUntil",
    ):
        assert hasattr(helper, name), name
    assert not hasattr(helper, "patch_env_helper")
    error = None
    try:
        with workers.patch_env(X="1"):
            pass
    except AttributeError as exc:
        error = str(exc)
    assert error is not None, "workers.patch_env() must fail as on workerd"
    assert "patch_env_helper" in error


class IdProbe(DurableObject):
    async def fetch(self, request):
        return Response(self.ctx.id.toString())


def workerd_id(unique_key, name):
    key = hashlib.sha256(unique_key.encode()).digest()
    first = hmac.new(key, name.encode(), "sha256").digest()[:16]
    return (first + hmac.new(key, first, "sha256").digest()[:16]).hex()


async def test_durable_object_ids_are_hmacs_of_the_namespace_key(env):
    _local_runtime.durableObjectNamespace("ID_PROBES", IdProbe)
    ns = env.ID_PROBES
    key = f"{CONFIG['name']}-IdProbe"  # what `wrangler dev` uses
    for name in ("a", "session-1", "ünïcode"):
        assert ns.idFromName(name).toString() == workerd_id(key, name)
    stub = ns.get(ns.idFromName("a"))
    assert await (await stub.fetch("http://do/")).text() == workerd_id(key, "a")
    unique = ns.newUniqueId().toString()
    assert ns.idFromString(unique).toString() == unique
    for foreign in (workerd_id("other-IdProbe", "a"), "0" * 64):
        error = None
        try:
            ns.idFromString(foreign)
        except Exception as exc:
            error = str(exc)
        assert error is not None, f"{foreign} is not an id of this namespace"
        assert "Durable Object ID is not valid for this namespace." in error
