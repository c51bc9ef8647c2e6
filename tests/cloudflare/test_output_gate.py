"""workerd's output gate, which the session's Durable Object relies on (issue 14, item 3):
real processes, real HTTP.

tests/workers/output_gate/ is a Worker whose Durable Object inserts a row with
`ctx.storage.sql.exec` and, in the same step, fetches a URL with the global fetch.
Served by `runtime/dev.py --config ...` (`wrangler dev` on real workerd); the URL is
an HTTP server in this process on 127.0.0.1 that, when a request arrives, reads the
object's SQLite file from outside (another connection: it sees committed
transactions only, as a crash would leave the file). So:
- a write then a fetch: when the request arrives, the row is committed;
- a write whose commit fails (a foreign key the object deferred to the commit, so
  the INSERT itself succeeds): workerd drops the held fetch (the server never sees
  it), rolls the object back to its last commit and resets it; the next request
  finds a fresh object with the earlier rows, and a write then a fetch works again.

Needs `scripts/setup-runtime` (node_modules/, the pinned Node and python_modules/).
"""

from __future__ import annotations

import http.client
import http.server
import json
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.served_worker import ServedWorker

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "workers" / "output_gate" / "wrangler.toml"
BLOB_BYTES = 1_000_000  # each row's data: a commit of some 250 pages, not a trivial one


class DevServer(ServedWorker):
    """The output gate test Worker served (`served_worker.ServedWorker`), started at once."""

    def __init__(self, state: Path) -> None:
        super().__init__(CONFIG, state)
        self.start_ready()

    def get(self, path: str) -> tuple[int, Any]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            connection.request("GET", path)
            answer = connection.getresponse()
            body = answer.read()
        finally:
            connection.close()
        try:
            return answer.status, json.loads(body)
        except ValueError:
            return answer.status, body.decode(errors="replace")

    def database(self) -> Path:
        """The object's SQLite file: <persist>/v3/do/<worker>-<class>/<id>.sqlite."""
        folder = self.state / "v3" / "do" / "output-gate-Writer"
        files = [f for f in folder.glob("*.sqlite") if f.name != "metadata.sqlite"]
        assert len(files) == 1, files
        return files[0]


class Receiver:
    """An HTTP server on 127.0.0.1: for each request ?key=K, whether row K was in the
    object's SQLite file when the request arrived."""

    def __init__(self) -> None:
        self.database: Path | None = None
        self.seen: list[dict[str, Any]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                key = query.get("key", [""])[0]
                receiver.seen.append({"key": key, "row": receiver.has_row(key)})
                body = b"ok"
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def has_row(self, key: str) -> bool:
        assert self.database is not None
        assert self.database.exists()
        # Another connection on the file (WAL): it sees committed transactions only.
        connection = sqlite3.connect(f"file:{self.database}?mode=ro", uri=True, timeout=5)
        try:
            found = connection.execute(
                "SELECT length(data) FROM notes WHERE key = ?", (key,)
            ).fetchone()
        finally:
            connection.close()
        assert found is None or found[0] == BLOB_BYTES, found
        return found is not None

    def keys(self) -> list[str]:
        return [seen["key"] for seen in self.seen]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    served = Receiver()
    try:
        yield served
    finally:
        served.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[DevServer]:
    served = DevServer(tmp_path_factory.mktemp("dev-output-gate"))
    try:
        status, rows = served.get("/do/gate/rows")  # creates the object and its tables
        assert (status, rows) == (200, []), (status, rows)
        receiver.database = served.database()
        yield served
    finally:
        served.close()


def write_then_fetch(server: DevServer, receiver: Receiver, key: str, fail: bool = False) -> Any:
    url = urllib.parse.quote(receiver.url, safe="")
    query = f"key={key}&url={url}&size={BLOB_BYTES}" + ("&fail=1" if fail else "")
    return server.get(f"/do/gate/write-then-fetch?{query}")


def test_a_fetch_after_a_write_leaves_once_the_write_is_committed(
    server: DevServer, receiver: Receiver
) -> None:
    for key in ("a", "b", "c"):
        status, answer = write_then_fetch(server, receiver, key)
        assert (status, answer) == (200, {"status": 200, "body": "ok"}), (status, answer)
        assert receiver.seen[-1]["key"] == key
        assert receiver.seen[-1]["row"], f"the request for {key} arrived before its commit"


def test_a_write_whose_commit_fails_drops_the_fetch_and_resets_the_object(
    server: DevServer, receiver: Receiver
) -> None:
    assert write_then_fetch(server, receiver, "kept")[0] == 200
    status, committed = server.get("/do/gate/rows")
    assert status == 200
    assert "kept" in committed
    before = receiver.keys()
    status, answer = write_then_fetch(server, receiver, "lost", fail=True)
    # The object's answer never comes: its caller (the Worker) gets the reset instead.
    assert status == 500, (status, answer)
    assert "Durable Object was reset and rolled back to its last known good state" in answer
    assert "FOREIGN KEY constraint failed" in answer
    time.sleep(1)
    assert receiver.keys() == before, "the fetch held for a failed commit reached the server"
    assert not receiver.has_row("lost")
    server.wait_line(r"Uncaught Error: Durable Object was reset and rolled back")
    # A fresh instance serves the next request; the failed write was rolled back.
    assert server.get("/do/gate/rows") == (200, committed)
    status, answer = write_then_fetch(server, receiver, "d")
    assert (status, answer) == (200, {"status": 200, "body": "ok"})
    assert receiver.seen[-1] == {"key": "d", "row": True}
