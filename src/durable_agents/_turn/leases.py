"""The session lease a durable run holds for its turn.

Taking it (waiting, bounded, while another live run holds it; at once from a
process of this host that is gone), naming its owner (`host/pid/run_id`), and
giving back one a run left behind. Why a run takes one, and what holding it
costs: the module docstring of `durable_agents.run` and docs/contract.md
(Concurrency). The CPython worker (`durable_agents.worker`) reads owners too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigurationError, SessionBusyError
from ..stores.base import LeaseHolder, Store

__all__ = ["RunLease", "died_on_this_host", "lease_owner", "release_left_lease", "take_lease"]


@dataclass(slots=True)
class RunLease:
    """The lease a run holds: its owner, its time to live, and whether a write gave it up."""

    owner: str
    ttl_ms: int
    released: bool = False


async def take_lease(
    store: Store, session_id: str, run_id: str, lease_seconds: float, wait_seconds: float
) -> RunLease:
    """Take the session's lease, waiting (bounded) while another live run holds it."""
    if lease_seconds <= 0 or wait_seconds < 0:
        raise ConfigurationError("lease_seconds must be > 0 and wait_seconds >= 0")
    lease = RunLease(lease_owner(run_id), int(lease_seconds * 1000))
    started = time.monotonic()
    delay = 0.005
    take_from: str | None = None
    while True:
        holder = await store.acquire_lease(
            session_id, lease.owner, lease.ttl_ms, take_from=take_from
        )
        if holder is None:
            return lease
        take_from = holder.owner if died_on_this_host(holder) else None
        if take_from is not None:
            continue  # its process is gone: take the lease over now, not at expiry
        waited = time.monotonic() - started
        if waited >= wait_seconds:
            raise SessionBusyError(session_id, holder.owner, holder.expires_at, waited)
        await asyncio.sleep(min(delay, wait_seconds - waited))
        delay = min(delay * 2, 0.25)


async def release_left_lease(store: Store, session_id: str, lease: RunLease | None) -> None:
    """Give the lease back if the turn's last write did not.

    Off the happy path (an error, a crash in this process, a lost race) the
    turn's last write did not release it. Best effort: a lease that stays
    behind expires."""
    if lease is not None and not lease.released:
        with contextlib.suppress(Exception):
            await store.release_lease(session_id, lease.owner)


def lease_owner(run_id: str) -> str:
    """The lease owner of a run of this process: `host/pid/run_id` (`died_on_this_host`)."""
    return f"{socket.gethostname()}/{os.getpid()}/{run_id}"


def died_on_this_host(holder: LeaseHolder) -> bool:
    """Whether the lease's owner was a process on this host that no longer runs."""
    host, _, rest = holder.owner.partition("/")
    pid_text = rest.partition("/")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, AttributeError):  # not ours to signal, or no signals here
        return False
    try:  # a killed child its parent has not reaped yet is a zombie: dead
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].startswith("Z")
