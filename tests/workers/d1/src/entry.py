"""A D1 Worker: a table of quotes, made on first use (test fixture)."""

from urllib.parse import parse_qs, urlparse

from workers import Response, WorkerEntrypoint

SCHEMA = "CREATE TABLE IF NOT EXISTS quotes (id INTEGER PRIMARY KEY, author TEXT, text TEXT)"


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        url = urlparse(request.url)
        await self.env.DB.prepare(SCHEMA).run()
        if url.path == "/add":
            query = parse_qs(url.query)
            await (
                self.env.DB.prepare("INSERT INTO quotes (author, text) VALUES (?, ?)")
                .bind(query["author"][0], query["text"][0])
                .run()
            )
            return Response("added", status=201)
        if url.path == "/quotes":
            result = await self.env.DB.prepare("SELECT author, text FROM quotes ORDER BY id").all()
            rows = [{"author": row.author, "text": row.text} for row in result.results]
            return Response.json(rows)
        return Response("not found", status=404)
