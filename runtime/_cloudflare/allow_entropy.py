"""When entropy may be used: inside a request, or within an allowance at top level."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from contextlib import contextmanager

EIO = 29  # what workerd's refusals carry: os.urandom fails as getentropy() would

# How many getentropy() calls the C level may still make at top level. One
# signed byte in wasm memory: the JS side (pyodide-host.mjs) reads it and
# counts it down on each call, and refuses a call when it is 0.
_allowance = array("b", [0])
_in_request = [False]


def allowance_address() -> int:
    """Where the allowance byte lives in wasm memory (read by the JS side)."""
    address: int = _allowance.buffer_info()[0]
    return address


def in_request_context() -> bool:
    return _in_request[0]


def enter_request_context() -> None:
    _in_request[0] = True


def entropy_allowed() -> bool:
    return _in_request[0] or _allowance[0] > 0


def raise_unless_entropy_allowed() -> None:
    if not entropy_allowed():
        raise OSError(EIO, "Cannot get entropy outside of request context")


@contextmanager
def allow_bad_entropy_calls(n: int) -> Iterator[None]:
    """Let the body make exactly `n` getentropy() calls at top level.

    Used around imports that seed something at import time (a Rust hash map,
    say). The bytes they get are a fixed pattern, as on workerd. A body that
    makes fewer calls than allowed is an error: the count documents what the
    import does, and a stale count would let other code through.
    """
    previous = _allowance[0]
    _allowance[0] = n
    try:
        yield
        left = _allowance[0]
        if left > 0:
            raise RuntimeError(f"{left} unexpected leftover getentropy calls")
    finally:
        _allowance[0] = previous
