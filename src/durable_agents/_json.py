"""JSON from outside, with a nesting limit checked before it is parsed.

Pyodide (Cloudflare Python Workers) runs CPython's C JSON parser and encoder
on a JS stack that a few thousand levels of `[[[[...` overflow. That is not a
`RecursionError`: it is a JS `RangeError` that leaves the interpreter dead
(`Pyodide already fatally failed`), and with it every session of the Worker.
On CPython the same input raises `RecursionError`, which is not a
`ValueError`, so a `except ValueError` meant for bad JSON lets it through.

So every parse of JSON the kit did not write itself goes through `loads`,
which refuses text nested deeper than `max_depth` (arrays and objects; 128
by default) before `json.loads` sees it, with `JSONTooDeepError`: a
`json.JSONDecodeError`, so code that already treats bad JSON as bad JSON
needs no change. `check_depth` does the same for Python values about to be
encoded (what a tool handler returns).

Speed: text with at most `max_depth` brackets in all cannot be too deep, and
two `str.count` calls say so at C speed. Only other text is scanned, once,
iteratively, skipping string literals; nothing here recurses.

Strict JSON (RFC 8259), whatever the sender wrote. Python's `json` reads and
writes `NaN` and `Infinity`, which no strict parser (`JSON.parse`, D1's
`json()`) reads back, and reads `1e400` as infinity; it also reads a lone
`"\\ud800"` escape into a str that cannot be encoded as UTF-8 (every store and
every HTTP answer then fails with `UnicodeEncodeError`). So `loads` refuses
non-finite numbers (`NonFiniteNumberError`, a `ValueError`) and repairs lone
surrogates to U+FFFD; `clean` does both for Python values (what a model
adapter or a handler built), and `repair_text` for one string.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .limits import MAX_JSON_DEPTH

__all__ = [
    "MAX_DEPTH",
    "STORED_MAX_DEPTH",
    "DepthScanner",
    "JSONTooDeepError",
    "NonFiniteNumberError",
    "check_depth",
    "check_text_depth",
    "clean",
    "loads",
    "repair_text",
]

MAX_DEPTH = MAX_JSON_DEPTH
"""How deep JSON from outside may nest: request bodies, LLM replies and tool
arguments, tool results, upstream responses. Real payloads stay far below."""

STORED_MAX_DEPTH = MAX_DEPTH + 8
"""The limit for the kit's own stored rows: a stored `tool_calls` column wraps
arguments (up to MAX_DEPTH deep) in a list of objects, so anything accepted
can always be read back."""

_STRING_BODY = r'[^"\\]*(?:\\.[^"\\]*)*'  # the inside of a string literal, escapes included
_TOKEN = rf'(?P<string>"{_STRING_BODY}")|(?P<open>[\[{{])|(?P<close>[\]}}])|(?P<quote>")'


class _Syntax:
    """The patterns for one text type (str or bytes)."""

    def __init__(self, kind: type) -> None:
        def compile_(pattern: str) -> Any:
            return re.compile(pattern if kind is str else pattern.encode(), re.S)

        self.tokens = compile_(_TOKEN)
        self.string_rest = compile_(_STRING_BODY)
        self.strings = compile_(f'"{_STRING_BODY}"')
        self.not_brackets = compile_(r"[^\[\]{}]+")
        self.quote: Any = '"' if kind is str else b'"'
        self.backslash: Any = "\\" if kind is str else b"\\"
        self.opens: frozenset[Any] = frozenset("[{" if kind is str else b"[{")


_SYNTAX = {str: _Syntax(str), bytes: _Syntax(bytes)}


class JSONTooDeepError(json.JSONDecodeError):
    """JSON nested deeper than the limit; refused before parsing. A `ValueError`."""

    def __init__(self, max_depth: int, doc: str = "", pos: int = 0) -> None:
        self.max_depth = max_depth
        super().__init__(f"JSON nested deeper than {max_depth} levels", doc, pos)


class NonFiniteNumberError(ValueError):
    """A number JSON cannot carry: NaN, an infinity, or a literal past the float range."""

    def __init__(self, what: str, why: str = "JSON has no NaN or infinities") -> None:
        super().__init__(f"{what} is not a JSON number ({why})")


_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def repair_text(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (the same str when it has none).

    A surrogate pair written as two code points (`"\\ud83d\\ude00"` built in
    Python) becomes the one character it encodes; any other surrogate is lone.
    """
    if text.isascii() or _SURROGATE.search(text) is None:  # (isascii: at C speed, no scan)
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _may_decode_to_surrogates(text: str) -> bool:
    """Whether JSON `text` may hold a lone surrogate once parsed: as a `\\u` escape, or as
    it is (not in ASCII text). Cheap checks first (a one-character search is a memchr):
    most text has neither."""
    if "\\" in text and _SURROGATE_ESCAPE.search(text) is not None:
        return True
    return not text.isascii() and _SURROGATE.search(text) is not None


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise NonFiniteNumberError(literal[:40], "it is past the range of a double, about 1.8e308")
    return value


def _no_constant(name: str) -> Any:
    raise NonFiniteNumberError(name)


# Made once: `json.loads` given options makes a decoder for every call (a stored
# session's load parses thousands of small texts).
_STRICT_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
_PYTHON_DECODER = json.JSONDecoder()


class DepthScanner:
    """Tracks the nesting depth of JSON text fed to it in pieces (str or bytes).

    `feed` raises `JSONTooDeepError` as soon as an array or object opens
    deeper than `max_depth`. A piece may end anywhere, inside a string or
    just after a backslash. Closing brackets never take the depth below 0, so
    text that closes more than it opened cannot hide a deep part after it.
    The scan only tracks brackets and string literals: it does not validate.
    """

    def __init__(self, max_depth: int = MAX_DEPTH) -> None:
        self.max_depth = max_depth
        self.depth = 0
        self.in_string = False
        self.escaped = False  # in a string, right after a backslash
        self.offset = 0  # characters (or bytes) fed before this piece

    def feed(self, piece: str | bytes) -> None:
        syntax = _SYNTAX[type(piece)]
        before = (self.depth, self.in_string, self.escaped)
        if not self._walk(piece, syntax):
            # Too deep. Scan again, token by token, to say where.
            self.depth, self.in_string, self.escaped = before
            self._scan(piece, syntax)
            raise JSONTooDeepError(self.max_depth, "", self.offset)  # (_scan raised already)
        self.offset += len(piece)

    def _walk(self, piece: Any, syntax: _Syntax) -> bool:
        """Feed `piece`; False if it goes too deep. Regexes do the work, at C speed:
        string literals are cut out, then only the brackets are walked."""
        pos = self._finish_string(piece, 0, syntax)
        if pos >= len(piece):
            return True
        rest = syntax.strings.sub(piece[:0], piece[pos:])
        quote = rest.find(syntax.quote)
        if quote >= 0:
            # A string left open at the end of the piece (no quote after it
            # can close anything, so nothing past this one was cut out).
            tail = rest[quote + 1 :]
            self.in_string = True
            self.escaped = (len(tail) - len(tail.rstrip(syntax.backslash))) % 2 == 1
            rest = rest[:quote]
        depth, limit, opens = self.depth, self.max_depth, syntax.opens
        for char in syntax.not_brackets.sub(piece[:0], rest):
            if char in opens:
                depth += 1
                if depth > limit:
                    return False
            elif depth:
                depth -= 1
        self.depth = depth
        return True

    def _scan(self, piece: Any, syntax: _Syntax) -> None:
        """Feed `piece` token by token, raising `JSONTooDeepError` with its position."""
        pos, end = 0, len(piece)
        while pos < end:
            if self.in_string:
                pos = self._finish_string(piece, pos, syntax)
                continue
            token = syntax.tokens.search(piece, pos)
            if token is None:
                return
            pos = token.end()
            if token.lastgroup == "open":
                self.depth += 1
                if self.depth > self.max_depth:
                    doc = piece if isinstance(piece, str) else ""
                    raise JSONTooDeepError(self.max_depth, doc, self.offset + token.start())
            elif token.lastgroup == "close":
                self.depth = max(0, self.depth - 1)
            elif token.lastgroup == "quote":  # a string that goes on past this piece
                self.in_string = True

    def _finish_string(self, piece: Any, pos: int, syntax: _Syntax) -> int:
        """Where the string left open by an earlier piece ends in `piece` (past its
        closing quote), or the end of `piece` if it goes on."""
        if not self.in_string:
            return pos
        if self.escaped:
            if pos >= len(piece):
                return pos
            self.escaped = False
            pos += 1
        pos = syntax.string_rest.match(piece, pos).end()
        if pos < len(piece):  # a closing quote, or a backslash that ends the piece
            if piece[pos : pos + 1] == syntax.quote:
                self.in_string = False
            else:
                self.escaped = True
            pos += 1
        return pos


def check_text_depth(text: str | bytes, max_depth: int = MAX_DEPTH) -> None:
    """Raise `JSONTooDeepError` if the JSON `text` nests deeper than `max_depth`."""
    if isinstance(text, str):
        opens = text.count("[") + text.count("{")
    else:
        opens = text.count(b"[") + text.count(b"{")
    if opens <= max_depth:  # cannot be deeper than it has brackets
        return
    DepthScanner(max_depth).feed(text)


def loads(
    text: str | bytes | bytearray,
    *,
    max_depth: int = MAX_DEPTH,
    repair: bool = True,
    non_finite: bool = False,
) -> Any:
    """`json.loads(text)` for strict JSON, refusing text nested deeper than `max_depth` first.

    Raises `JSONTooDeepError` (a `json.JSONDecodeError`) for too-deep text,
    `NonFiniteNumberError` for `NaN`, `Infinity` or a number past the float
    range, and whatever `json.loads` raises for text that is not JSON (all
    `ValueError`s). Lone surrogates (escaped or not) come back as U+FFFD, unless
    `repair=False` (a piece of a stream: half of a pair may end one piece and the
    other half begin the next; the joined text is repaired, see `LLMResponse`).
    Bytes are decoded as `json.loads` would (UTF-8/16/32).

    `non_finite=True` reads `NaN`, `Infinity` and numbers past the float range
    as Python's `json` does (as float NaN and infinities), for a document whose
    parts are judged one by one: a model's whole reply, where such a number in
    one call's arguments makes that call invalid (`messages.LLMResponse` cleans
    them), not the reply.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode(json.detect_encoding(text), "surrogatepass")
    check_text_depth(text, max_depth)
    if text.startswith("\ufeff"):  # as json.loads refuses it
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    value = (_PYTHON_DECODER if non_finite else _STRICT_DECODER).decode(text)
    if repair and _may_decode_to_surrogates(text):
        value = _repaired(value)
    return value


def clean(value: Any, max_depth: int = MAX_DEPTH) -> Any:
    """`value` (a Python value about to be stored or sent as JSON) made strict JSON.

    Raises `JSONTooDeepError` for a value nested deeper than `max_depth` (a
    cycle included) and `NonFiniteNumberError` for a NaN or infinite float;
    returns `value` itself, or a copy with lone surrogates in its strings
    (keys too) replaced by U+FFFD. Iterative, like `check_depth`.
    """
    check_depth(value, max_depth)
    dirty = False
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise NonFiniteNumberError(repr(item))
        elif isinstance(item, str):
            # (ASCII text has no surrogate: told without a scan)
            dirty = dirty or (not item.isascii() and _SURROGATE.search(item) is not None)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return _repaired(value) if dirty else value


def _repaired(value: Any) -> Any:
    """A copy of `value` with its strings repaired (`repair_text`). Recursive, on values
    already known to nest at most a bounded depth."""
    if isinstance(value, str):
        return repair_text(value)
    if isinstance(value, dict):
        return {_repaired(k): _repaired(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_repaired(v) for v in value]
    return value


def check_depth(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Raise JSONTooDeepError (a ValueError) if `value` nests dicts, lists and tuples deeper
    than `max_depth`.

    For a value about to be encoded: `json.dumps` of a too-deep value
    overflows the stack on Pyodide as `json.loads` does. Iterative; a cycle
    counts as too deep.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > max_depth:
            raise JSONTooDeepError(max_depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, _CONTAINERS))


_CONTAINERS = (dict, list, tuple)
