"""A cron Worker: scheduled() records each run; GET / lists them (test fixture)."""

from workers import Response, WorkerEntrypoint

RUNS: list[dict[str, object]] = []


class Default(WorkerEntrypoint):
    async def scheduled(self, controller, env, ctx):
        RUNS.append({"cron": controller.cron, "scheduledTime": controller.scheduledTime})
        if controller.cron == "fail":
            raise RuntimeError("the scheduled handler failed")

    async def fetch(self, request):
        return Response.json(RUNS)
