"""The schedules endpoints of the Worker's API on CPython: `POST/GET /sessions/{name}/schedules`
and `DELETE /sessions/{name}/schedules/{id}`.

Every bad request gets a clear error and reaches no session (the fake dispatch is not
called): bad JSON, bad fields, bad times, bad ids, wrong methods, a session token that
may only read. `Command.from_json` (the object's side of the hop) refuses hand-made bad
schedule commands. Then the object's side (`serve_session` on the fake D1 with a fake
alarm): an unknown session, the cap of waiting schedules, a time the Worker did not check.
test_dev_server_alarms.py drives the same endpoints over HTTP on real workerd.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from tests.support.app_calls import Recorder

from durable_agents import Agent, LLMResponse, Message
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.alarms import ObjectAlarm
from durable_agents.cloudflare.app import (
    DEFAULT_MAX_BODY_BYTES,
    Command,
    LiveSession,
    Reply,
    error_reply,
    handle_request,
    serve_alarm,
    serve_session,
)
from durable_agents.schedules import MAX_DELAY_SECONDS, MAX_SCHEDULES_PER_SESSION
from durable_agents.stores.base import Schedule
from durable_agents.stores.d1 import D1Store
from durable_agents.testing import FunctionLLM
from durable_agents.testing.fake_d1 import FakeD1Database

TOKEN = "master-token"
SECRET = "0123456789abcdef0123456789abcdef-secret"
ENV = {"API_TOKEN": TOKEN, "SESSION_TOKEN_SECRET": SECRET}
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
PATH = "/sessions/a/schedules"
SOON = datetime.datetime.fromtimestamp(NOW + 3600, datetime.UTC).isoformat()


async def call(
    method: str, path: str = PATH, body: bytes | Any = b"", *, bearer: str = TOKEN,
    headers: dict[str, str] | None = None, env: dict[str, str] | None = None,
    recorder: Recorder | None = None,
) -> Reply:  # fmt: skip
    """One request; `body` as raw bytes, or anything else as its JSON."""
    raw = body if isinstance(body, bytes) or callable(body) else json.dumps(body).encode()
    return await handle_request(
        method, path, {"authorization": f"Bearer {bearer}", **(headers or {})}, raw,
        env=ENV if env is None else env, dispatch=recorder or Recorder(), clock=lambda: NOW,
    )  # fmt: skip


def code(reply: Reply) -> str:
    error = reply.body["error"]
    assert set(error) == {"code", "message"}
    assert error["message"]
    return str(error["code"])


async def refused(
    method: str, body: bytes | Any = b"", path: str = PATH, **kwargs: Any
) -> tuple[int, str, str]:
    """(status, code, message) of a request that must reach no session."""
    recorder = Recorder()
    reply = await call(method, path, body, recorder=recorder, **kwargs)
    assert recorder.commands == [], reply.body
    return reply.status, code(reply), reply.body["error"]["message"]


# --- the body of POST /schedules ---


def _raw(text: str) -> bytes:
    return text.encode()


DEEP = b"[" * 5000 + b"]" * 5000
BAD_JSON = [
    b"{",
    b"not json",
    b'{"message": "x", "delay_seconds": 5,}',
    b"\xff\xfe{}",  # not UTF-8
    b"",
    b"  \n ",
    DEEP,
    b'{"message": "x", "delay_seconds": ' + DEEP + b"}",
    b'{"message": "x", "delay_seconds": NaN}',
    b'{"message": "x", "delay_seconds": Infinity}',
    b'{"message": "x", "delay_seconds": -Infinity}',
    b'{"message": "x", "delay_seconds": 1e999}',  # a double's infinity, as text
    b'{"message": "x", "delay_seconds": -1e999}',
    b'{"message": "x", "delay_seconds": ' + b"1" * 5000 + b"}",  # past int's text limit
]


@pytest.mark.parametrize("body", BAD_JSON, ids=range(len(BAD_JSON)))
async def test_a_body_that_is_not_json_is_a_400(body: bytes) -> None:
    status, error, _ = await refused("POST", body)
    assert (status, error) == (400, "invalid-json")


@pytest.mark.parametrize("body", [b"[]", b'["message", "x"]', b'"hi"', b"null", b"5", b"true"])
async def test_a_body_that_is_not_an_object_is_a_422(body: bytes) -> None:
    status, error, message = await refused("POST", body)
    assert (status, error) == (422, "invalid-body")
    assert "JSON object" in message


async def test_a_body_over_max_body_bytes_is_a_413() -> None:
    big = {"message": "x" * DEFAULT_MAX_BODY_BYTES, "delay_seconds": 5}
    assert (await refused("POST", big))[:2] == (413, "body-too-large")
    small = {**ENV, "MAX_BODY_BYTES": "100"}
    body = {"message": "y" * 100, "delay_seconds": 5}
    assert (await refused("POST", body, env=small))[:2] == (413, "body-too-large")
    assert (await call("POST", body={"message": "y", "delay_seconds": 5}, env=small)).status == 200


async def test_a_declared_length_over_the_limit_is_a_413_before_the_body_is_read() -> None:
    async def never() -> bytes:
        raise AssertionError("the body was read")

    headers = {"content-length": str(DEFAULT_MAX_BODY_BYTES + 1)}
    assert (await refused("POST", never, headers=headers))[:2] == (413, "body-too-large")
    bad = {"content-length": "12abc"}
    assert (await refused("POST", never, headers=bad))[:2] == (400, "invalid-request")


@pytest.mark.parametrize(
    ("body", "mentions"),
    [
        ({"delay_seconds": 5}, "'message'"),
        ({"message": "", "delay_seconds": 5}, "'message'"),
        ({"message": "  \n\t", "delay_seconds": 5}, "'message'"),
        ({"message": None, "delay_seconds": 5}, "'message'"),
        ({"message": 5, "delay_seconds": 5}, "'message'"),
        ({"message": True, "delay_seconds": 5}, "'message'"),
        ({"message": ["x"], "delay_seconds": 5}, "'message'"),
        ({"message": {"text": "x"}, "delay_seconds": 5}, "'message'"),
        ({"message": "x", "delay_seconds": 5, "delay": 5}, "'delay'"),
        ({"message": "x", "delay_seconds": 5, "request_key": "k"}, "'request_key'"),
        ({"message": "x", "at": SOON, "schedule_id": "sch_1"}, "'schedule_id'"),
        ({"message": "x", "delay_seconds": 5, "Message": "y"}, "'Message'"),
    ],
)
async def test_a_bad_message_or_an_unknown_field_is_a_422_invalid_body(
    body: dict[str, Any], mentions: str
) -> None:
    status, error, message = await refused("POST", body)
    assert (status, error) == (422, "invalid-body")
    assert mentions in message


def _after(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(NOW + seconds, datetime.UTC).isoformat()


@pytest.mark.parametrize(
    ("when", "mentions"),
    [
        ({}, "exactly one"),
        ({"delay_seconds": None}, "exactly one"),
        ({"at": None}, "exactly one"),
        ({"delay_seconds": None, "at": None}, "exactly one"),
        ({"delay_seconds": 5, "at": SOON}, "exactly one"),
        ({"delay_seconds": "60"}, "must be a number"),
        ({"delay_seconds": "NaN"}, "must be a number"),
        ({"delay_seconds": "1e999"}, "must be a number"),
        ({"delay_seconds": True}, "must be a number"),
        ({"delay_seconds": False}, "must be a number"),
        ({"delay_seconds": [5]}, "must be a number"),
        ({"delay_seconds": {"s": 5}}, "must be a number"),
        ({"delay_seconds": -1}, "0 or more"),
        ({"delay_seconds": -0.001}, "0 or more"),
        ({"delay_seconds": MAX_DELAY_SECONDS + 1}, "400 days"),
        ({"delay_seconds": MAX_DELAY_SECONDS + 0.5}, "400 days"),
        ({"delay_seconds": 1e300}, "400 days"),
        ({"at": "2027-01-15T09:00:00"}, "time zone"),  # no zone
        ({"at": "2027-01-15"}, "time zone"),
        ({"at": "tomorrow"}, "ISO 8601"),
        ({"at": ""}, "ISO 8601"),
        ({"at": "2027-13-01T00:00:00Z"}, "ISO 8601"),
        ({"at": "2027-01-15T09:00:00+24:00"}, "ISO 8601"),
        ({"at": "\uff12027-01-15T09:00:00Z"}, "ISO 8601"),  # a full-width digit
        ({"at": "2027-01-15T09:00:00Z" + " " * 60}, "ISO 8601"),  # over 64 characters
        ({"at": 1_800_003_600}, "ISO 8601"),
        ({"at": True}, "ISO 8601"),
        ({"at": ["2027-01-15T09:00:00Z"]}, "ISO 8601"),
        ({"at": _after(MAX_DELAY_SECONDS + 1)}, "400 days"),
        ({"at": "9999-12-31T23:59:59Z"}, "400 days"),
    ],
)
async def test_a_bad_time_is_a_422_invalid_schedule(when: dict[str, Any], mentions: str) -> None:
    status, error, message = await refused("POST", {"message": "ping", **when})
    assert (status, error) == (422, "invalid-schedule")
    assert mentions in message


async def test_a_delay_past_a_doubles_range_in_json_digits_is_a_422() -> None:
    body = b'{"message": "ping", "delay_seconds": 1' + b"0" * 400 + b"}"  # 10**400
    status, error, message = await refused("POST", body)
    assert (status, error) == (422, "invalid-schedule")
    assert "400 days" in message


async def test_a_negative_delay_past_a_doubles_range_in_json_digits_is_a_422() -> None:
    body = b'{"message": "ping", "delay_seconds": -1' + b"0" * 400 + b"}"  # -(10**400)
    status, error, message = await refused("POST", body)
    assert (status, error) == (422, "invalid-schedule")
    assert "0 or more" in message


# --- DELETE /schedules/{id} ---


@pytest.mark.parametrize(
    "schedule_id",
    ["a%20b", "a%2Fb", "sch_1;drop", "<script>", "caf\u00e9", "sch_%00", "x" * 101, "a\tb"],
)
async def test_a_schedule_id_with_odd_characters_or_too_long_is_a_404(schedule_id: str) -> None:
    status, error, message = await refused("DELETE", path=f"{PATH}/{schedule_id}")
    assert (status, error) == (404, "schedule-not-found")
    assert len(message) < 250  # the id is cut, not echoed whole


@pytest.mark.parametrize("path", [f"{PATH}/", f"{PATH}/a/b", f"{PATH}//"])
async def test_a_path_past_the_schedule_id_is_not_found(path: str) -> None:
    assert (await refused("DELETE", path=path))[:2] == (404, "not-found")


# --- methods ---


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", PATH, "GET, POST"),
        ("PATCH", PATH, "GET, POST"),
        ("DELETE", PATH, "GET, POST"),
        ("HEAD", PATH, "GET, POST"),
        ("GET", f"{PATH}/sch_1", "DELETE"),
        ("POST", f"{PATH}/sch_1", "DELETE"),
        ("PUT", f"{PATH}/sch_1", "DELETE"),
        ("PATCH", f"{PATH}/sch_1", "DELETE"),
    ],
)
async def test_wrong_methods_are_405_with_allow(method: str, path: str, allowed: str) -> None:
    recorder = Recorder()
    reply = await call(method, path, {"message": "x", "delay_seconds": 5}, recorder=recorder)
    assert (reply.status, code(reply)) == (405, "method-not-allowed")
    assert reply.headers["Allow"] == allowed
    assert recorder.commands == []


async def test_without_the_token_nothing_is_scheduled() -> None:
    for bearer in ("", "wrong", TOKEN + "x"):
        status, error, _ = await refused(
            "POST", {"message": "x", "delay_seconds": 5}, bearer=bearer
        )
        assert (status, error) == (401, "unauthorized")


# --- session tokens: read the list, never make or cancel ---


async def mint(name: str) -> str:
    reply = await call("POST", f"/sessions/{name}/token")
    assert reply.status == 200, reply.body
    return str(reply.body["token"])


async def test_a_session_token_lists_its_schedules_but_may_not_make_or_cancel_one() -> None:
    token = await mint("a")
    recorder = Recorder()
    listed = await call("GET", bearer=token, recorder=recorder)
    assert listed.status == 200
    assert recorder.commands == [("a", Command("schedules", name="a"))]

    made = await refused("POST", {"message": "x", "delay_seconds": 5}, bearer=token)
    assert made[:2] == (403, "forbidden")
    cancelled = await refused("DELETE", path=f"{PATH}/sch_1", bearer=token)
    assert cancelled[:2] == (403, "forbidden")
    # Still 403 with a bad body or id: the grant is checked before them.
    assert (await refused("POST", b"{", bearer=token))[:2] == (403, "forbidden")
    assert (await refused("DELETE", path=f"{PATH}/a%20b", bearer=token))[:2] == (403, "forbidden")


@pytest.mark.parametrize(
    ("method", "path"), [("GET", PATH), ("POST", PATH), ("DELETE", f"{PATH}/sch_1")]
)
async def test_a_token_for_another_session_is_a_403(method: str, path: str) -> None:
    token = await mint("b")
    status, error, message = await refused(
        method, {"message": "x", "delay_seconds": 5}, path=path, bearer=token
    )
    assert (status, error) == (403, "forbidden")
    assert "'b'" in message


# --- what is forwarded ---


@pytest.mark.parametrize(
    "body",
    [
        {"message": "Check the build", "delay_seconds": 600},
        {"message": "Check the build", "delay_seconds": 0},
        {"message": "Check the build", "delay_seconds": 0.25},
        {"message": "Check the build", "delay_seconds": MAX_DELAY_SECONDS},
        {"message": "Check the build", "at": SOON},
        {"message": "Check the build", "at": "2027-01-15T09:00:00+01:00"},
        {"message": "Check the build", "at": "2027-01-01T00:00:00Z"},  # past: due at once
        {"message": "caf\u00e9 \U0001f600", "at": _after(MAX_DELAY_SECONDS)},
    ],
)
async def test_a_good_post_is_forwarded_as_a_schedule_command_carrying_the_body(
    body: dict[str, Any],
) -> None:
    recorder = Recorder()
    reply = await call("POST", body=body, recorder=recorder)
    assert reply.status == 200, reply.body
    assert recorder.commands == [("a", Command("schedule", schedule=body, name="a"))]
    sent = recorder.commands[0][1]
    assert Command.from_json(sent.to_json()) == sent  # the object takes it as sent


async def test_get_and_delete_are_forwarded() -> None:
    recorder = Recorder()
    assert (await call("GET", recorder=recorder)).status == 200
    assert (await call("DELETE", f"{PATH}/sch_0f9.a:b~c-d", recorder=recorder)).status == 200
    assert recorder.commands == [
        ("a", Command("schedules", name="a")),
        ("a", Command("unschedule", schedule_id="sch_0f9.a:b~c-d", name="a")),
    ]
    for _, sent in recorder.commands:
        assert Command.from_json(sent.to_json()) == sent


# --- Command.from_json: the object's side of the hop ---


def _command(**fields: Any) -> str:
    return json.dumps(fields)


@pytest.mark.parametrize(
    "text",
    [
        _command(action="schedule"),
        _command(action="schedule", schedule=None),
        _command(action="schedule", schedule=[]),
        _command(action="schedule", schedule="ping in 5"),
        _command(action="schedule", schedule={"message": "x"}),
        _command(action="schedule", schedule={"message": "x", "delay_seconds": 5, "at": SOON}),
        _command(action="schedule", schedule={"message": "x", "delay_seconds": 5, "due_at": 1}),
        _command(action="schedule", schedule={"delay_seconds": 5}),
        _command(action="schedule", schedule={"message": "", "delay_seconds": 5}),
        _command(action="schedule", schedule={"message": " \n", "delay_seconds": 5}),
        _command(action="schedule", schedule={"message": 5, "delay_seconds": 5}),
        _command(action="schedule", schedule={"message": "x", "delay_seconds": 5}, message="x"),
        _command(action="schedule", schedule={"message": "x", "delay_seconds": 5}, request_key="k"),
        _command(action="schedule", schedule={"message": "x", "delay_seconds": 5}, stream=True),
        _command(action="schedule", schedule={"message": "x", "delay_seconds": 5}, after=1),
        _command(action="schedule", schedule={"message": "x", "delay_seconds": 5}, limit=5),
        _command(action="schedule", schedule={"message": "x", "delay_seconds": 5}, name="a b"),
        _command(action="unschedule"),
        _command(action="unschedule", schedule_id=None),
        _command(action="unschedule", schedule_id=""),
        _command(action="unschedule", schedule_id=5),
        _command(action="unschedule", schedule_id=["sch_1"]),
        _command(action="unschedule", schedule_id="a b"),
        _command(action="unschedule", schedule_id="sch/1"),
        _command(action="unschedule", schedule_id="caf\u00e9"),
        _command(action="unschedule", schedule_id="x" * 101),
        _command(action="unschedule", schedule_id="sch_1\n"),
        _command(action="unschedule", schedule_id="sch_1", message="x"),
        _command(action="unschedule", schedule_id="sch_1", stream=True),
        _command(action="schedules", stream=True),
        _command(action="schedules", after=0),
        _command(action="schedules", limit=1),
        _command(action="schedules", message="x"),
        _command(action="Schedule", schedule={"message": "x", "delay_seconds": 5}),
    ],
)
def test_from_json_refuses_a_bad_schedule_command(text: str) -> None:
    with pytest.raises(ValueError, match="not a command"):
        Command.from_json(text)


@pytest.mark.parametrize(
    "command",
    [
        Command("schedule", schedule={"message": "ping", "delay_seconds": 5}, name="a"),
        Command("schedule", schedule={"message": "ping", "delay_seconds": 0.5}),
        Command("schedule", schedule={"message": "ping", "at": SOON}, name="a"),
        Command("schedule", schedule={"message": "caf\u00e9 \U0001f600", "at": SOON}, name="a"),
        Command("schedules", name="a"),
        Command("schedules"),
        Command("unschedule", schedule_id="sch_" + "f" * 32, name="a"),
        Command("unschedule", schedule_id="x" * 100, name="a"),
        Command("unschedule", schedule_id="a.b:c~d-e_f"),
    ],
)
def test_schedule_commands_round_trip(command: Command) -> None:
    assert Command.from_json(command.to_json()) == command


# --- the object's side: serve_session on the fake D1, with a fake alarm ---


class FakeStorage:
    """A Durable Object's storage, as ObjectAlarm uses it: a few keys and one alarm."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.alarm: int | None = None

    async def get(self, key: str) -> Any:
        return self.values.get(key)

    async def put(self, key: str, value: Any) -> None:
        self.values[key] = value

    async def delete(self, key: str) -> None:
        self.values.pop(key, None)

    async def setAlarm(self, when: int) -> None:  # the JS names
        self.alarm = when

    async def deleteAlarm(self) -> None:
        self.alarm = None


AGENT = Agent("schedules-test", "You answer.", [], max_message_bytes=1000)
ECHO = FunctionLLM(lambda messages, tools: LLMResponse(f"done: {messages[-1].content}"))


class Deployment:
    """The Worker and its session objects in one process, with the hop between them as
    JSON (what src/entry.py does: a command the object cannot parse is a 400)."""

    def __init__(self, store: D1Store) -> None:
        self.store = store
        self.storage = FakeStorage()
        self.now = NOW  # the one clock of the Worker and its objects, moved by a test
        self.alarm = ObjectAlarm(self.storage, clock=lambda: self.now)
        self.live = LiveSession()

    async def object(self, command: Command) -> Reply:
        return await serve_session(
            command, session_id=f"id-{command.name}", store=self.store, env=ENV,
            live=self.live, agent=AGENT, make_deps=lambda env, http: None,
            alarm=self.alarm, llm=ECHO,
        )  # fmt: skip

    async def ring(self, name: str = "a") -> None:
        """The object's alarm goes off (as the object's alarm() does), at `self.now`."""
        await serve_alarm(
            f"id-{name}", self.store, self.live, self.alarm,
            lambda command: self.object(command.model_copy(update={"name": name})),
        )  # fmt: skip

    async def dispatch(self, name: str, command: Command) -> Reply:
        try:
            parsed = Command.from_json(command.to_json())
        except ValueError as exc:
            return error_reply(400, "invalid-command", str(exc))
        return await self.object(parsed)

    async def __call__(self, method: str, path: str = PATH, body: Any = None) -> Reply:
        raw = b"" if body is None else json.dumps(body).encode()
        return await handle_request(
            method, path, {"authorization": f"Bearer {TOKEN}"}, raw, env=ENV,
            dispatch=self.dispatch, clock=lambda: self.now,
        )  # fmt: skip

    async def start(self, name: str = "a") -> None:
        await self.store.append_messages_atomic(f"id-{name}", 0, [Message.user("hi")])


@pytest.fixture
async def deployment() -> Deployment:
    store = d1_store(FakeD1Database())
    await store.create_tables()
    return Deployment(store)


async def test_schedules_of_a_session_that_does_not_exist_are_a_404(
    deployment: Deployment,
) -> None:
    made = await deployment("POST", body={"message": "ping", "delay_seconds": 5})
    assert (made.status, code(made)) == (404, "session-not-found")
    listed = await deployment("GET")
    assert (listed.status, code(listed)) == (404, "session-not-found")
    gone = await deployment("DELETE", f"{PATH}/sch_1")
    assert (gone.status, code(gone)) == (404, "schedule-not-found")
    assert await deployment.store.load_schedules("id-a") == []
    assert await deployment.store.get_session("id-a") is None  # nothing created either
    assert deployment.storage.alarm is None


async def test_make_list_and_cancel_a_schedule(deployment: Deployment) -> None:
    await deployment.start()
    made = await deployment("POST", body={"message": "ping", "delay_seconds": 5})
    assert made.status == 201, made.body
    assert set(made.body) == {"session_id", "schedule_id", "message", "at", "created_at"}
    assert made.body["session_id"] == "id-a"
    assert made.body["at"] == "2027-01-15T08:00:05.000Z"
    assert deployment.storage.alarm == int(NOW * 1000) + 5000  # armed for it
    listed = await deployment("GET")
    assert listed.body["schedules"] == [{k: made.body[k] for k in made.body if k != "session_id"}]

    unknown = await deployment("DELETE", f"{PATH}/sch_unknown")
    assert (unknown.status, code(unknown)) == (404, "schedule-not-found")
    gone = await deployment("DELETE", f"{PATH}/{made.body['schedule_id']}")
    assert (gone.status, gone.body) == (
        200,
        {"schedule_id": made.body["schedule_id"], "deleted": True},
    )
    assert (await deployment("GET")).body["schedules"] == []
    assert deployment.storage.alarm is None  # nothing waits
    again = await deployment("DELETE", f"{PATH}/{made.body['schedule_id']}")
    assert (again.status, code(again)) == (404, "schedule-not-found")


async def test_a_session_with_the_most_schedules_waiting_takes_no_more(
    deployment: Deployment,
) -> None:
    await deployment.start()
    waiting = [
        Schedule(f"sch_{n}", f"ping {n}", int(NOW * 1000) + 60_000 + n, int(NOW * 1000))
        for n in range(MAX_SCHEDULES_PER_SESSION)
    ]
    for first in range(0, len(waiting), 25):  # D1 runs at most 50 statements a batch
        await deployment.store.append_messages_atomic(
            "id-a", 1, [], schedules=waiting[first : first + 25]
        )
    full = await deployment("POST", body={"message": "one more", "delay_seconds": 5})
    assert (full.status, code(full)) == (422, "invalid-schedule")
    assert str(MAX_SCHEDULES_PER_SESSION) in full.body["error"]["message"]
    assert len(await deployment.store.load_schedules("id-a")) == MAX_SCHEDULES_PER_SESSION
    assert (await deployment("DELETE", f"{PATH}/sch_7")).status == 200
    assert (await deployment("POST", body={"message": "now", "delay_seconds": 5})).status == 201


@pytest.mark.parametrize(
    "spec",
    [
        {"message": "ping", "delay_seconds": "60"},
        {"message": "ping", "delay_seconds": -5},
        {"message": "ping", "delay_seconds": True},
        {"message": "ping", "delay_seconds": MAX_DELAY_SECONDS + 1},
        {"message": "ping", "at": "2027-01-15T09:00:00"},
        {"message": "ping", "at": 5},
        {"message": "x" * 1001, "delay_seconds": 5},  # over the agent's max_message_bytes
    ],
)
async def test_the_object_checks_a_schedule_the_worker_did_not(
    deployment: Deployment, spec: dict[str, Any]
) -> None:
    """A hand-made command that from_json takes (it checks the shape, not the time) is
    refused by the object all the same: a 422, nothing stored, no alarm."""
    await deployment.start()
    command = Command.from_json(_command(action="schedule", schedule=spec, name="a"))
    reply = await deployment.object(command)
    assert (reply.status, code(reply)) == (422, "invalid-schedule")
    assert await deployment.store.load_schedules("id-a") == []
    assert deployment.storage.alarm is None


@pytest.mark.parametrize(
    "when", [{"delay_seconds": 5, "at": None}, {"delay_seconds": None, "at": SOON}]
)
async def test_a_null_for_the_other_time_field_is_made_or_refused_by_the_worker(
    deployment: Deployment, when: dict[str, Any]
) -> None:
    await deployment.start()
    reply = await deployment("POST", body={"message": "ping", **when})
    assert reply.status in (201, 422), reply.body


# --- recurring schedules (issue 36) ---


@pytest.mark.parametrize(
    ("when", "mentions"),
    [
        ({"cron": "61 * * * *"}, "not a valid expression"),
        ({"cron": "0 9 * *"}, "five fields"),
        ({"cron": "0 9 * * *", "timezone": "Europe/Nowhere"}, "unknown time zone"),
        ({"cron": "0 9 * * *", "timezone": 2}, "IANA time zone name"),
        ({"cron": 9}, "cron must be a cron expression"),
        ({"every_seconds": 59}, "every_seconds must be 60"),
        ({"every_seconds": "900"}, "whole number"),
        ({"every_seconds": 900.0}, "whole number"),
        ({"every_seconds": 60, "cron": "* * * * *"}, "exactly one of cron and every_seconds"),
        ({"every_seconds": 60, "delay_seconds": 5}, "delay_seconds is for a one-off"),
        ({"cron": "* * * * *", "at": SOON}, "give no at"),
        ({"every_seconds": 60, "at": "2027-01-15"}, "time zone"),
        ({"timezone": "UTC", "delay_seconds": 5}, "timezone goes with cron"),
        ({"timezone": "UTC"}, "timezone goes with cron"),
    ],
)
async def test_a_bad_rule_is_a_422_invalid_schedule(when: dict[str, Any], mentions: str) -> None:
    status, error, message = await refused("POST", {"message": "ping", **when})
    assert (status, error) == (422, "invalid-schedule")
    assert mentions in message


async def test_a_recurring_schedule_shows_its_rule_and_next_occurrence(
    deployment: Deployment,
) -> None:
    await deployment.start()
    cron = {"message": "digest", "cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"}
    made = await deployment("POST", body=cron)
    assert made.status == 201, made.body
    # 2027-01-15 is a Friday, 09:00 in Berlin already past (08:00Z): Monday 09:00 (+01:00).
    assert made.body["next_at"] == made.body["at"] == "2027-01-18T08:00:00.000Z"
    assert (made.body["cron"], made.body["timezone"]) == ("0 9 * * 1-5", "Europe/Berlin")
    every = await deployment("POST", body={"message": "tick", "every_seconds": 900})
    assert every.status == 201, every.body
    assert every.body["next_at"] == "2027-01-15T08:15:00.000Z"
    assert every.body["every_seconds"] == 900
    assert "cron" not in every.body
    assert deployment.storage.alarm == int(NOW * 1000) + 900_000  # armed for the earliest
    listed = (await deployment("GET")).body["schedules"]
    assert [s["schedule_id"] for s in listed] == [
        every.body["schedule_id"], made.body["schedule_id"],
    ]  # fmt: skip
    assert listed[1] == {k: v for k, v in made.body.items() if k != "session_id"}


async def test_the_objects_alarm_runs_each_occurrence_once_and_missed_ones_as_one(
    deployment: Deployment,
) -> None:
    await deployment.start()
    made = (await deployment("POST", body={"message": "tick", "every_seconds": 60})).body
    first = int(NOW * 1000) + 60_000
    assert deployment.storage.alarm == first

    async def ticks() -> list[str | None]:
        history = await deployment.store.load_messages("id-a")
        return [m.request_key for m in history if m.role == "user" and m.origin == "scheduled"]

    deployment.now = NOW + 61
    await deployment.ring()
    await deployment.ring()  # the same occurrence again (an alarm run twice): nothing more
    assert await ticks() == [f"schedule:{made['schedule_id']}@{first}"]
    assert deployment.storage.alarm == first + 60_000  # the next one, from the rule
    history = await deployment.store.load_messages("id-a")
    assert history[-1].content == "done: tick"
    # A day with nothing to wake the object: one catch-up turn, then the rhythm again.
    deployment.now = NOW + 86_400 + 30
    await deployment.ring()
    await deployment.ring()
    assert len(await ticks()) == 2
    (row,) = await deployment.store.load_schedules("id-a")
    assert row.due_at == int(NOW * 1000) + 86_460_000  # the grid's first after now
    assert deployment.storage.alarm == row.due_at
    # Deleted: no occurrence runs again.
    assert (await deployment("DELETE", f"{PATH}/{made['schedule_id']}")).status == 200
    deployment.now = NOW + 2 * 86_400
    await deployment.ring()
    assert len(await ticks()) == 2
