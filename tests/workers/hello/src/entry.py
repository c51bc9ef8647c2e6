"""A hello-world Python Worker (test fixture: served by scripts/dev --config)."""

from urllib.parse import urlparse

from greeting import make_greeting
from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path = urlparse(request.url).path
        if path == "/":
            return Response(make_greeting(self.env.GREETING, "world"))
        if path == "/secret":
            # From .dev.vars beside the config.
            return Response(self.env.SECRET_WORD)
        if path == "/path":
            import sys

            return Response.json([p for p in sys.path if "site-packages" not in p])
        return Response("not found", status=404)
