"""The crash sweep of the core, inside workerd (Pyodide 314) on its real D1."""

from tests.support.crash_sweep import sweep

from durable_agents.cloudflare import d1_store


async def test_every_crash_point_keeps_tools_at_most_once_on_d1(env):
    store = d1_store(env.DB)
    await store.create_tables()
    report = await sweep(store, prefix="d1-sweep")
    print(f"crash sweep on D1 (workerd): {report}")
    assert report.scenarios == 2 * (report.baseline_appends + report.baseline_handler_calls)
