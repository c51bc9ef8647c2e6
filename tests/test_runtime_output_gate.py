"""The local runtime's output gate (issue 14, item 3): real processes, real HTTP.

tests/workers/output_gate/ is a Worker whose Durable Object inserts a row with
`ctx.storage.sql.exec` and, in the same step, fetches a URL with the global fetch.
Served by `node runtime/dev-server.mjs --config ...` with the runtime's test hooks
(DURABLE_AGENTS_RUNTIME_TEST_HOOKS=1) and every implicit commit delayed by
COMMIT_DELAY_MS (a slow disk), and the URL is an HTTP server in this process on
127.0.0.1 that, when a request arrives, reads the object's SQLite file from outside
(another connection, as a crash would leave it). So:
- a write then a fetch: the request arrives only after the commit (the row is in
  the file when it arrives, at least COMMIT_DELAY_MS after the write);
- a write whose commit fails (injected): the fetch is dropped with an error, the
  server never sees it, the row is not in the file, and the object is reset;
- the benchmark (printed with -s, or `python tests/test_runtime_output_gate.py`):
  writes per second through the object with and without the gate, side by side.

Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from served_worker import ServedWorker

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "workers" / "output_gate" / "wrangler.toml"
COMMIT_DELAY_MS = 300


class DevServer(ServedWorker):
    """The output gate test Worker served (`served_worker.ServedWorker`), started at once."""

    def __init__(self, state: Path, env: dict[str, str]) -> None:
        super().__init__(CONFIG, state, {**os.environ, **env})
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
        files = list((self.state / "v3" / "do" / "output-gate-Writer").glob("*.sqlite"))
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
                key = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get(
                    "key", [""]
                )[0]
                receiver.seen.append({"key": key, "row": receiver.has_row(key), "at": time.time()})
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
        if self.database is None or not self.database.exists():
            return False
        # Another connection on the file: it sees committed transactions only.
        connection = sqlite3.connect(f"file:{self.database}?mode=ro", uri=True, timeout=5)
        try:
            return (
                connection.execute("SELECT 1 FROM notes WHERE key = ?", (key,)).fetchone()
                is not None
            )
        except sqlite3.OperationalError:
            return False
        finally:
            connection.close()

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
    hooks = {
        "DURABLE_AGENTS_RUNTIME_TEST_HOOKS": "1",
        "DURABLE_AGENTS_RUNTIME_COMMIT_DELAY_MS": str(COMMIT_DELAY_MS),
    }
    served = DevServer(tmp_path_factory.mktemp("dev-output-gate"), hooks)
    try:
        status, rows = served.get("/do/gate/rows")  # creates the object and its table
        assert (status, rows) == (200, []), (status, rows)
        receiver.database = served.database()
        yield served
    finally:
        served.close()


def test_a_fetch_after_a_write_leaves_once_the_write_is_durable(
    server: DevServer, receiver: Receiver
) -> None:
    url = urllib.parse.quote(receiver.url, safe="")
    for key in ("a", "b", "c"):
        asked = time.time()
        status, answer = server.get(f"/do/gate/write-then-fetch?key={key}&url={url}")
        assert (status, answer) == (200, {"status": 200, "body": "ok"}), (status, answer)
        seen = receiver.seen[-1]
        assert seen["key"] == key
        assert seen["row"], f"the request for {key} arrived before its row was committed"
        # The commit is delayed by COMMIT_DELAY_MS: the request waited for it.
        assert seen["at"] - asked >= COMMIT_DELAY_MS / 1000 * 0.9, seen["at"] - asked


def test_a_failed_write_drops_the_fetch_and_resets_the_object(
    server: DevServer, receiver: Receiver
) -> None:
    url = urllib.parse.quote(receiver.url, safe="")
    before = receiver.keys()
    status, answer = server.get(f"/do/gate/write-then-fetch?key=lost&url={url}&fail=1")
    # The object's answer is held too, and becomes an error.
    assert status == 500, (status, answer)
    time.sleep(0.5)
    assert receiver.keys() == before, "the dropped fetch reached the server"
    assert not receiver.has_row("lost")
    assert any("reset: Durable Object storage write failed" in line for line in server.lines), (
        server.lines[-20:]
    )
    # A fresh instance serves the next event; the failed write was rolled back.
    status, rows = server.get("/do/gate/rows")
    assert (status, rows) == (200, ["a", "b", "c"]), (status, rows)
    status, answer = server.get(f"/do/gate/write-then-fetch?key=d&url={url}")
    assert (status, answer) == (200, {"status": 200, "body": "ok"})
    assert receiver.seen[-1] == {**receiver.seen[-1], "key": "d", "row": True}


def bench(state: Path, gate: bool, receiver: Receiver, n: int = 300) -> dict[str, float]:
    served = DevServer(state, {"DURABLE_AGENTS_RUNTIME_OUTPUT_GATE": "on" if gate else "off"})
    try:
        rates = {}
        for label, fetch in (
            ("writes", ""),
            ("write+fetch", urllib.parse.quote(receiver.url, safe="")),
        ):
            served.get(f"/do/bench/bench?n=20&fetch={fetch}")  # warm up
            status, answer = served.get(f"/do/bench/bench?n={n}&fetch={fetch}")
            assert status == 200, answer
            rates[label] = answer["n"] / answer["seconds"]
        return rates
    finally:
        served.close()


if __name__ == "__main__":  # the benchmark: writes per second with and without the gate
    import tempfile

    receiving = Receiver()
    with tempfile.TemporaryDirectory() as scratch:
        off = bench(Path(scratch) / "off", False, receiving, 1000)
        on = bench(Path(scratch) / "on", True, receiving, 1000)
    receiving.close()
    print(f"{'per second, one object':<28}{'no gate':>12}{'output gate':>14}{'ratio':>8}")
    for name in off:
        print(f"{name:<28}{off[name]:>12.0f}{on[name]:>14.0f}{on[name] / off[name]:>8.2f}")
