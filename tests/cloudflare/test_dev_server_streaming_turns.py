"""Streaming turns over HTTP against `scripts/dev` (the Worker, its Durable Object and D1 in
the local runtime), with a fake OpenAI-compatible model that streams its answers in chunks
200 ms apart (worker_fakes.FakeServices): deltas arrive while the model still writes, a
client that disconnects and comes back with Last-Event-ID gets every later message once,
cancel stops a turn and /resume finishes it, and kill -9 mid-stream loses nothing stored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from tests.support.worker_fakes import DURABILITY_REPLY, FakeServices, read_history, serving

from durable_agents.testing.worker import DevWorker, SSEEvent

CHUNK_DELAY_S = 0.2


@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fake:
        fake.chunk_delay = CHUNK_DELAY_S
        yield fake


@pytest.fixture(scope="module")
def worker(services: FakeServices, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevWorker]:
    with serving(services, tmp_path_factory.mktemp("dev-streaming")) as dev:
        yield dev.worker


@pytest.fixture(autouse=True)
def _fresh_services(services: FakeServices) -> None:
    services.reset()


def messages_of(events: list[SSEEvent]) -> list[tuple[int, Any]]:
    return [(int(e.id or "-1"), e.data) for e in events if e.event == "message"]


def stored(worker: DevWorker, name: str) -> list[dict[str, Any]]:
    def get(path: str) -> Any:
        answer = worker.get(path)
        assert answer.status == 200, answer.body
        return answer.body

    return read_history(get, name)


def test_the_first_delta_arrives_while_the_model_is_still_writing(
    worker: DevWorker, services: FakeServices
) -> None:
    with worker.stream("POST", "/sessions/fast/messages", {"message": "triage issue 3"}) as events:
        assert events.status == 200
        assert events.headers["content-type"].startswith("text/event-stream")
        seen = list(events)
    first_delta = next(e for e in seen if e.event == "delta")
    first_message = next(e for e in seen if e.event == "message")  # after that call's end
    # the model sends each call's text in several chunks 200 ms apart: the first piece
    # is here at least one chunk gap before the call's answer is stored
    assert first_message.at - first_delta.at >= CHUNK_DELAY_S * 0.9
    assert seen[-1].event == "done"
    assert seen[-1].data["status"] == "complete"
    assert [data for _, data in messages_of(seen)] == stored(worker, "fast")
    assert [p for p, _ in messages_of(seen)] == list(range(len(stored(worker, "fast"))))


def test_a_client_that_reconnects_with_last_event_id_gets_every_later_message_once(
    worker: DevWorker, services: FakeServices
) -> None:
    with worker.stream("POST", "/sessions/drop/messages", {"message": "triage issue 4"}) as events:
        first = next(e for e in events if e.event == "message")
    # disconnected: the turn goes on without a client
    last_id = first.id
    assert last_id == "0"
    time.sleep(CHUNK_DELAY_S)
    with worker.stream("GET", "/sessions/drop/events", headers={"last-event-id": last_id}) as again:
        assert again.status == 200
        rest = list(again)
    assert rest[-1].event == "done"
    assert rest[-1].data["status"] == "complete"  # followed live, or finished before we came back
    history = stored(worker, "drop")
    got = messages_of(rest)
    assert [p for p, _ in got] == list(range(1, len(history)))  # each later one, exactly once
    assert [data for _, data in got] == history[1:]
    assert history[-1]["content"].startswith("Triaged issue 4")
    assert len(services.posts) == 1


def test_cancel_mid_turn_then_resume_finishes_it(worker: DevWorker, services: FakeServices) -> None:
    with worker.stream("POST", "/sessions/stop/messages", {"message": "triage issue 5"}) as events:
        iterator = iter(events)
        first_delta = next(e for e in iterator if e.event == "delta")
        assert first_delta.data["text"]
        answer = worker.post("/sessions/stop/cancel")
        assert answer.status == 200, answer.body
        assert answer.body["status"] == "cancelled"
        rest = list(iterator)
    assert rest[-1].event == "done"
    assert rest[-1].data["status"] == "cancelled"
    assert services.posts == []
    assert [m["role"] for m in stored(worker, "stop")] == ["user"]  # the call was abandoned

    resumed = worker.post("/sessions/stop/resume")
    assert resumed.status == 200, resumed.body
    assert resumed.body["status"] == "complete"
    assert len(services.posts) == 1
    assert worker.post("/sessions/stop/cancel").status == 409  # nothing runs now


def test_kill_9_mid_stream_then_events_from_the_last_id_replay_what_is_stored(
    worker: DevWorker, services: FakeServices
) -> None:
    # The module's server (its other sessions are finished turns): killed here and started
    # again on its state, so the test file's last test costs one start, not two.
    services.hold_posts = True  # the post lands, then the webhook holds its answer
    got: list[SSEEvent] = []

    def listen() -> None:
        try:
            with worker.stream(
                "POST", "/sessions/crash/messages", {"message": "triage issue 6"}
            ) as events:
                got.extend(events)
        except OSError:
            pass  # the server died under it

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert services.post_received.wait(60), "the post never arrived"
    worker.kill()  # SIGKILL, mid-stream, between the post and its stored result
    listener.join(10)
    last_seen = max(int(e.id) for e in got if e.event == "message" and e.id is not None)
    services.hold_posts = False
    services.release_posts.set()

    worker.restart()
    with worker.stream(
        "GET", "/sessions/crash/events", headers={"last-event-id": str(last_seen - 2)}
    ) as again:
        replay = list(again)
    history = stored(worker, "crash")
    positions = [p for p, _ in messages_of(replay)]
    assert positions == list(range(last_seen - 1, last_seen - 1 + len(positions)))
    assert [data for _, data in messages_of(replay)] == history[positions[0] : positions[-1] + 1]
    # The replay ends at what is stored (the post step has no result yet), or, when the
    # object's alarm resumed the turn first (the request woke it), follows that to its end.
    if replay[-1].data["status"] == "interrupted":
        # (what the client missed of the stream before the kill is in it)
        assert positions[-1] >= last_seen
    else:
        assert replay[-1].data["status"] == "complete", replay[-1]
        assert positions[-1] == len(history) - 1

    resumed = worker.post("/sessions/crash/resume")
    assert resumed.status == 200, resumed.body
    assert resumed.body["response"] == DURABILITY_REPLY
    assert len(services.posts) == 1  # never posted twice
