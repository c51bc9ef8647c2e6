"""httpx inside Pyodide, through FetchTransport and the runtime's fetch, to a local server."""

import httpx

from durable_agents.cloudflare import FetchTransport


def _client(base_url, **kwargs):
    return httpx.AsyncClient(base_url=base_url, transport=FetchTransport(), **kwargs)


async def test_get_and_post_round_trip(local_http_server):
    async with _client(local_http_server) as client:
        got = await client.get("/echo?q=1", headers={"x-custom": "yes"})
        assert got.status_code == 201
        assert got.headers["x-reply"] == "yes"
        assert got.headers["set-cookie"] == "a=1"
        echoed = got.json()
        assert echoed["path"] == "/echo?q=1"
        assert echoed["headers"]["x-custom"] == "yes"

        posted = await client.post("/echo", json={"text": "héllo 😀"})
        body = posted.json()
        assert body["method"] == "POST"
        assert body["body"] == '{"text":"héllo 😀"}'
        assert body["headers"]["content-type"] == "application/json"


async def test_compressed_body_is_decoded_once(local_http_server):
    async with _client(local_http_server) as client:
        response = await client.get("/gzip")
        assert "content-encoding" not in response.headers
        assert response.json() == {"compressed": True}


async def test_body_streams_in_chunks(local_http_server):
    async with _client(local_http_server) as client, client.stream("GET", "/stream") as response:
        lines = [line async for line in response.aiter_lines() if line]
    assert lines == ["data: 0", "data: 1", "data: 2"]


async def test_redirects_are_httpx_s_choice(local_http_server):
    async with _client(local_http_server) as client:
        assert (await client.get("/redirect")).status_code == 302
        followed = await client.get("/redirect", follow_redirects=True)
        assert followed.status_code == 201
        assert followed.json()["path"] == "/echo"


async def test_unreachable_server_is_a_connect_error():
    async with _client("http://127.0.0.1:9") as client:
        error = None
        try:
            await client.get("/")
        except httpx.ConnectError as exc:
            error = str(exc)
    assert error is not None, "a request to a closed port succeeded"
    assert "fetch failed" in error
