"""RetryPolicy and the retry loop, with an injected clock, sleep and random."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from durable_agents.llm import (
    LLMAuthenticationError,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMRateLimitError,
    RetryPolicy,
)
from durable_agents.llm._retry import call_with_retries, parse_retry_after


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def policy(time: FakeTime, **options: float) -> RetryPolicy:
    return RetryPolicy(
        sleep=time.sleep,
        clock=time.clock,
        random=lambda: 1.0,  # the top of the jitter range, so waits are exact
        **options,  # type: ignore[arg-type]
    )


class Flaky:
    """Fails with the given errors, then returns "ok"."""

    def __init__(self, *errors: LLMError) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.time_left: list[float | None] = []

    async def __call__(self, time_left: float | None) -> str:
        self.calls += 1
        self.time_left.append(time_left)
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


async def test_exponential_backoff_capped_by_max_delay() -> None:
    time = FakeTime()
    attempt = Flaky(*(LLMHTTPError(500) for _ in range(5)))
    result = await call_with_retries(
        policy(time, max_attempts=6, base_delay=1, max_delay=5), attempt
    )
    assert result == "ok"
    assert time.waits == [1, 2, 4, 5, 5]


def test_full_jitter_draws_from_zero_to_the_ceiling() -> None:
    draws = iter([0.0, 0.25, 0.999])
    retry = RetryPolicy(base_delay=2, max_delay=100, random=lambda: next(draws))
    assert [retry.backoff(1), retry.backoff(2), retry.backoff(3)] == [0.0, 1.0, 7.992]


async def test_retry_after_is_honoured_instead_of_backoff() -> None:
    time = FakeTime()
    attempt = Flaky(LLMRateLimitError(429, retry_after=7.5))
    assert await call_with_retries(policy(time, max_delay=1), attempt) == "ok"
    assert time.waits == [7.5]


async def test_non_retryable_errors_fail_at_once() -> None:
    time = FakeTime()
    attempt = Flaky(LLMAuthenticationError(401))
    with pytest.raises(LLMAuthenticationError) as caught:
        await call_with_retries(policy(time), attempt)
    assert attempt.calls == 1
    assert caught.value.attempts == 1
    assert time.waits == []


async def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    time = FakeTime()
    attempt = Flaky(LLMHTTPError(502), LLMHTTPError(503), LLMConnectionError("reset"))
    with pytest.raises(LLMConnectionError) as caught:
        await call_with_retries(policy(time, max_attempts=3), attempt)
    assert caught.value.attempts == 3
    assert attempt.calls == 3


async def test_the_deadline_stops_retries_and_bounds_each_attempt() -> None:
    time = FakeTime()
    attempt = Flaky(*(LLMHTTPError(500) for _ in range(10)))
    retry = policy(time, max_attempts=10, base_delay=4, max_delay=4, deadline=10)
    with pytest.raises(LLMHTTPError):
        await call_with_retries(retry, attempt)
    # waits of 4 s: attempts at t=0 and t=4; the wait to t=8 still fits, the next would not
    assert time.waits == [4, 4]
    assert attempt.time_left == [10, 6, 2]


async def test_a_retry_after_past_the_deadline_is_not_waited_for() -> None:
    time = FakeTime()
    attempt = Flaky(LLMRateLimitError(429, retry_after=3600))
    with pytest.raises(LLMRateLimitError):
        await call_with_retries(policy(time, deadline=60), attempt)
    assert time.waits == []


def test_retryable_statuses() -> None:
    assert [
        s
        for s in (400, 401, 403, 404, 408, 409, 422, 429, 500, 502, 529)
        if LLMHTTPError(s).retryable
    ] == [408, 409, 429, 500, 502, 529]


def test_none_means_one_attempt_and_bad_values_are_refused() -> None:
    assert RetryPolicy.none().max_attempts == 1
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="deadline"):
        RetryPolicy(deadline=0)


@pytest.mark.parametrize(
    ("header", "expected"),
    [("3", 3.0), (" 1.5 ", 1.5), ("-4", 0.0), ("", None), (None, None), ("soon", None)],
)
def test_parse_retry_after_seconds(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header) == expected


def test_parse_retry_after_http_date() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    later = format_datetime(datetime(2026, 1, 2, 3, 4, 35, tzinfo=UTC), usegmt=True)
    assert parse_retry_after(later, now=now.timestamp) == 30.0
    earlier = format_datetime(datetime(2026, 1, 2, 3, 0, 0, tzinfo=UTC), usegmt=True)
    assert parse_retry_after(earlier, now=now.timestamp) == 0.0
