"""`check_agent` inside workerd on its real D1: the refunds example, whose
`issue_refund` requires approval, swept over every write (the decisions and claims
included), once approving every refund and once denying every refund. (Edited approvals
on real D1: tests/cloudflare/test_dev_server_turn_features.py and the store conformance
suite; the edit sweep would add 50 s here.)"""

import examples.refunds.agent as refunds

from durable_agents.cloudflare import d1_store
from durable_agents.testing import check_agent_async


async def test_check_agent_sweeps_the_refunds_approvals_on_d1(env):
    store = d1_store(env.DB)
    await store.create_tables()
    report = await check_agent_async(
        refunds, config=None, env={"PAYMENTS_API_URL": ""},
        store=lambda directory: store, decide="both",
    )  # fmt: skip
    print(f"check_agent on D1 (workerd): {report}")
    # Approving: 6 appends a turn all at once, 7 one tool a step; denying: 5 and 6;
    # two turns, both sides of each append.
    assert report.crash_points == ((6 + 7) * 2 + (5 + 6) * 2) * 2
    assert report.approval_tools == ("issue_refund",)
    assert report.approved > 0
    assert report.denied > 0
    assert report.durability_errors > 0
