"""Retrying one LLM call: exponential backoff with full jitter, `Retry-After`, a deadline.

Only `chat()` and `stream()` retry. An LLM call has no side effect, so
repeating it is safe; a tool call is never retried here (see `safe_to_retry`
in tools.py). A stream that breaks midway is retried whole, and what was
already yielded is not yielded again (`stream_with_retries`).

The policy's knobs and the errors: docs/llm-providers.md#retries-timeouts-errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ..errors import ConfigurationError
from ..messages import LLMResponse, StreamPart, TextDelta, ToolCallDelta
from .errors import LLMConnectionError, LLMError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How `chat()` (and `stream()`) retries a failed LLM call.

    - `max_attempts`: calls in all, the first included (1 = never retry).
    - `base_delay` / `max_delay`: the wait before retry n is a random value in
      [0, min(max_delay, base_delay * 2**(n-1))] ("full jitter"), unless the
      provider sent `Retry-After`, which is honoured as given.
    - `deadline`: seconds from the first attempt after which no new attempt
      starts; a wait that would end past it is not begun, and each attempt's
      HTTP timeout is cut to the time left.
    - `sleep`, `random`, `clock`: injectable so tests run fast and repeatably.

    `RetryPolicy.none()` fails on the first error. Bad values are a
    `ConfigurationError` (a `ValueError`).
    """

    max_attempts: int = 4
    base_delay: float = 1.0
    max_delay: float = 30.0
    deadline: float = 300.0
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)
    random: Callable[[], float] = field(default=random.random, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.base_delay < 0 or self.max_delay < 0 or self.deadline <= 0:
            raise ConfigurationError("base_delay and max_delay must be >= 0 and deadline > 0")

    @classmethod
    def none(cls) -> RetryPolicy:
        return cls(max_attempts=1)

    def backoff(self, retry: int) -> float:
        """The jittered wait before retry number `retry` (1-based)."""
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** (retry - 1))
        return self.random() * ceiling


def attempt_timeout(limit: float | None, time_left: float) -> float:
    """One attempt's timeout: its own limit (if any) cut to what is left of the deadline.

    Never unbounded: with no per-attempt limit, the deadline still bounds a call
    that never answers (a hung call would otherwise hold its session forever).
    """
    return max(0.001, time_left if limit is None else min(limit, time_left))


async def call_with_retries(policy: RetryPolicy, attempt: Callable[[float], Awaitable[T]]) -> T:
    """Call `attempt(time_left)` until it succeeds, fails for good, or the policy runs out.

    `attempt` raises `LLMError`; one with `retryable` set (and, for HTTP
    errors, a `retry_after`) is tried again. The error that ends the loop is
    raised with `attempts` set to the number of calls made.
    """
    start = policy.clock()
    tries = 0
    while True:
        tries += 1
        time_left = policy.deadline - (policy.clock() - start)
        try:
            return await attempt(time_left)
        except LLMError as exc:
            await _wait_or_raise(policy, exc, tries, start)


async def _wait_or_raise(policy: RetryPolicy, exc: LLMError, tries: int, start: float) -> None:
    """Sleep before the next attempt, or raise `exc` (with `attempts` set) when none is due."""
    exc.attempts = tries
    if not exc.retryable or tries >= policy.max_attempts:
        raise exc
    retry_after = getattr(exc, "retry_after", None)
    delay = retry_after if retry_after is not None else policy.backoff(tries)
    if policy.clock() - start + delay >= policy.deadline:
        raise exc
    await policy.sleep(delay)


async def stream_with_retries(
    policy: RetryPolicy,
    attempt: Callable[[float], AsyncGenerator[StreamPart, None]],
    *,
    provider: str = "",
) -> AsyncIterator[StreamPart]:
    """Iterate `attempt(time_left)` (deltas, then one `LLMResponse`), retrying as `chat()`.

    An attempt that fails before its first piece, or breaks midway, is
    retried whole per the policy. What reaches the caller never repeats:
    the text yielded so far is kept, and a retry's text yields only what
    extends beyond it; once a retry's text diverges from it, no more
    `TextDelta`s are yielded for this call. After a midway break no more
    `ToolCallDelta`s are yielded. The `LLMResponse` always comes, last.
    """
    start = policy.clock()
    tries = 0
    shown = ""  # the text yielded to the caller so far
    text_open = True  # may more TextDeltas be yielded?
    calls_open = True  # may more ToolCallDeltas be yielded?
    yielded = False  # has the caller seen any piece yet?
    while True:
        tries += 1
        time_left = policy.deadline - (policy.clock() - start)
        matched = 0  # how much of `shown` this attempt's text has repeated
        try:
            async with contextlib.aclosing(attempt(time_left)) as parts:
                async for part in parts:
                    if isinstance(part, LLMResponse):
                        yield part
                        return
                    if isinstance(part, ToolCallDelta):
                        if calls_open:
                            yielded = True
                            yield part
                        continue
                    if not isinstance(part, TextDelta) or not part.text or not text_open:
                        continue
                    overlap = shown[matched : matched + len(part.text)]
                    if not part.text.startswith(overlap):
                        text_open = False  # the retry words it differently
                        continue
                    matched += len(part.text)
                    extra = part.text[len(overlap) :]
                    if extra:
                        shown += extra
                        yielded = True
                        yield TextDelta(extra)
            raise LLMConnectionError(
                f"{provider or 'the LLM provider'}'s stream ended without a final response",
                provider=provider,
            )
        except LLMError as exc:
            await _wait_or_raise(policy, exc, tries, start)
            if yielded:
                calls_open = False


def parse_retry_after(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from a `Retry-After` value: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - now()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)
