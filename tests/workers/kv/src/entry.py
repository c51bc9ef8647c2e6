"""A KV and R2 Worker (test fixture): /put/<key>/<value>, /get/<key>, /list on KV;
/bucket/put/<key>/<value>, /bucket/get/<key> on R2; /vars: the config's [vars]."""

from urllib.parse import urlparse

from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        parts = urlparse(request.url).path.strip("/").split("/")
        if parts[0] == "put":
            await self.env.FOO.put(parts[1], parts[2])
            return Response("stored")
        if parts[0] == "get":
            value = await self.env.FOO.get(parts[1])
            return Response("(none)" if value is None else value)
        if parts[0] == "list":
            listed = await self.env.FOO.list()
            return Response.json([key["name"] for key in listed["keys"]])
        if parts[0] == "vars":
            names = (
                "URL_WITH_SLASHES",
                "NOT_A_COMMENT",
                "QUOTED",
                "COMMA_BRACE",
                "COMMA_BRACKET",
                "BACKSLASH",
            )
            return Response.json({name: getattr(self.env, name) for name in names})
        if parts[:2] == ["bucket", "put"]:
            stored = await self.env.BUCKET.put(parts[2], parts[3])
            return Response.json({"key": stored.key, "size": stored.size})
        if parts[:2] == ["bucket", "get"]:
            found = await self.env.BUCKET.get(parts[2])
            return Response("(none)" if found is None else await found.text())
        return Response("not found", status=404)
