"""A KV Worker: /put/<key>/<value>, /get/<key>, /list; /bucket touches an unserved R2 binding."""

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
            return Response(self.env.URL_WITH_SLASHES)
        if parts[0] == "bucket":
            try:
                await self.env.BUCKET.get("x")
            except Exception as error:
                return Response(f"{type(error).__name__}: {error}", status=500)
            return Response("served?")
        return Response("not found", status=404)
