r"""Example strings for regular expressions: what `TestLLM` writes in a field with a `pattern`.

    sample_pattern(r"^\d{4}-\d{2}-\d{2}$")                   "1111-11-11"
    sample_pattern(r"^[a-z]+$", min_length=5)                 "aaaaa"
    sample_pattern(r"^(?:mr|ms)\.? [A-Z][a-z]+$", variant=1)  "mr Ab"

A small parser of its own for the core that JSON schema's, pydantic's and Python's
regex dialects share: literals and escapes (`\.`, `\n`, `\x41`, `\u00e9`), `.`,
`\d \w \s` and their negations, classes with ranges and negation (`[a-z0-9_]`,
`[^@\s]`, `[[:alpha:]]`), groups (capturing, named, `(?:...)`, atomic, inline
flags), alternation, quantifiers (`? * + {n} {n,} {n,m}`, lazy or possessive),
anchors (`^ $ \A \z \Z \b \B`), back-references and `\p{L}`-style general
categories. What it does not follow (lookarounds, conditionals, verbose mode,
class set operations) raises `PatternNotSampled`, saying what and where.

Deterministic, with no state: a class gives the first character of
`_PREFERRED` it allows ("a", then "1", then "A", ...: so `\d{4}-\d{2}-\d{2}` is
a real date), a quantifier the fewest repetitions that reach the wanted length.
`variant=k` gives the k-th other string of the same length (the last variable
character counts up first), for arrays whose items must differ. Every string is
checked against the pattern with `re.search`, as JSON schema and pydantic apply
a pattern (anywhere in the string), whenever Python's `re` compiles the pattern.
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

# The order in which a class's characters are tried: letters and digits that make
# plausible values first ("1111-11-11" is a date, "11:11" a time), then the rest
# of printable ASCII.
_PREFERRED = (
    "a1A"
    + string.ascii_lowercase[1:]
    + "0"
    + string.digits[2:]
    + string.ascii_uppercase[1:]
    + " -_.@:/+"
    + "".join(c for c in string.punctuation if c not in "-_.@:/+")
    + "\t\n\r\f\v"
)
_CHOICES = 16  # characters a class offers to variants: plenty to make items differ
_MAX_REPEAT = 10_000
_SEARCH_SPAN = 256  # lengths tried beyond the shortest before giving up


class PatternNotSampled(ValueError):
    """No example string could be made for `pattern`; `reason` says why."""

    def __init__(self, pattern: str, reason: str) -> None:
        self.pattern = pattern
        self.reason = reason
        super().__init__(f"pattern '{pattern}': {reason}")


# -- the parsed pattern ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Set:
    """One character out of ranges and tests (categories), or out of everything else."""

    ranges: tuple[tuple[int, int], ...] = ()
    tests: tuple[Callable[[str], bool], ...] = ()
    negated: bool = False
    choices: list[str] = field(default_factory=list, compare=False)

    def allows(self, char: str) -> bool:
        code = ord(char)
        inside = any(lo <= code <= hi for lo, hi in self.ranges) or any(
            test(char) for test in self.tests
        )
        return inside != self.negated

    def options(self) -> list[str]:
        """The characters a string may have here, best first (at most `_CHOICES`)."""
        if not self.choices:
            found = [c for c in _PREFERRED if self.allows(c)][:_CHOICES]
            if not found:  # a class of characters outside printable ASCII
                candidates = (
                    (chr(c) for lo, hi in self.ranges for c in range(lo, min(hi, lo + 64) + 1))
                    if not self.negated
                    else (chr(c) for c in range(0xA0, 0x3000))
                )
                found = [c for c in candidates if self.allows(c)][:_CHOICES]
            self.choices.extend(found)
        return self.choices


@dataclass(frozen=True, slots=True)
class _Char:
    chars: _Set


@dataclass(frozen=True, slots=True)
class _Seq:
    items: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Alt:
    options: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Repeat:
    item: _Node
    low: int
    high: int | None


@dataclass(frozen=True, slots=True)
class _Group:
    item: _Node
    index: int | None  # None: not capturing


@dataclass(frozen=True, slots=True)
class _Backref:
    index: int


@dataclass(frozen=True, slots=True)
class _Anchor:
    """A zero-width assertion (^, $, \\b, ...): nothing is written for it; the final
    `re.search` check catches a string it would refuse."""

    kind: str


_Node = _Char | _Seq | _Alt | _Repeat | _Group | _Backref | _Anchor


def _literal(char: str) -> _Set:
    return _Set(ranges=((ord(char), ord(char)),))


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


_DIGIT = _Set(tests=(str.isdigit,))
_WORD = _Set(tests=(_is_word,))
_SPACE = _Set(tests=(str.isspace,))
_CLASS_ESCAPES = {
    "d": _DIGIT,
    "D": _Set(tests=(str.isdigit,), negated=True),
    "w": _WORD,
    "W": _Set(tests=(_is_word,), negated=True),
    "s": _SPACE,
    "S": _Set(tests=(str.isspace,), negated=True),
}
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_POSIX: dict[str, Callable[[str], bool]] = {
    "alpha": str.isalpha,
    "digit": str.isdigit,
    "alnum": str.isalnum,
    "upper": str.isupper,
    "lower": str.islower,
    "space": str.isspace,
    "word": _is_word,
    "xdigit": lambda c: c in string.hexdigits,
    "punct": lambda c: c in string.punctuation,
    "print": str.isprintable,
    "graph": lambda c: c.isprintable() and not c.isspace(),
    "blank": lambda c: c in " \t",
    "cntrl": lambda c: unicodedata.category(c) == "Cc",
    "ascii": lambda c: ord(c) < 128,
}
_ANY = _Set(ranges=((ord("\n"), ord("\n")),), negated=True)
_CATEGORIES = frozenset(  # Unicode's general categories, and their first letters
    ["L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No",
     "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So",
     "Z", "Zs", "Zl", "Zp", "C", "Cc", "Cf", "Cs", "Co", "Cn"]
)  # fmt: skip


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.pos = 0
        self.groups: dict[int, _Node] = {}
        self.names: dict[str, int] = {}
        self.count = 0
        # Set on syntax Python's `re` reads otherwise (or not at all) than the regex
        # dialects of JSON schema and pydantic: then `re` cannot check the string.
        self.foreign = False

    # -- reading --

    def fail(self, what: str, at: int | None = None) -> PatternNotSampled:
        where = self.pos if at is None else at
        return PatternNotSampled(self.pattern, f"{what} (at position {where})")

    def peek(self, ahead: int = 0) -> str:
        index = self.pos + ahead
        return self.pattern[index] if index < len(self.pattern) else ""

    def take(self) -> str:
        if self.pos >= len(self.pattern):
            raise self.fail("the pattern ends too early")
        char = self.pattern[self.pos]
        self.pos += 1
        return char

    def startswith(self, text: str) -> bool:
        return self.pattern.startswith(text, self.pos)

    def named_backref(self, skip: int, close: str, start: int) -> _Backref:
        """A back-reference by name, `(?P=name)` or `\\k<name>`: its name begins `skip`
        characters on and ends at `close`, which the parser is left past."""
        end = self.pattern.find(close, self.pos)
        name = self.pattern[self.pos + skip : end]
        if end < 0 or name not in self.names:
            raise self.fail(f"a back-reference to an unknown group {name!r}", start)
        self.pos = end + 1
        return _Backref(self.names[name])

    # -- grammar --

    def parse(self) -> _Node:
        node = self.alternation()
        if self.pos < len(self.pattern):
            raise self.fail("an unbalanced ')'")
        return node

    def alternation(self) -> _Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else _Alt(tuple(options))

    def sequence(self) -> _Node:
        items: list[_Node] = []
        while self.peek() not in ("", "|", ")"):
            start = self.pos
            atom = self.atom()
            if atom is None:
                continue
            while True:
                bounds = self.quantifier()
                if bounds is None:
                    break
                if isinstance(atom, _Anchor):
                    raise self.fail("a quantifier on an anchor", start)
                atom = _Repeat(atom, *bounds)
            items.append(atom)
        return items[0] if len(items) == 1 else _Seq(tuple(items))

    def quantifier(self) -> tuple[int, int | None] | None:
        char = self.peek()
        if char in ("*", "+", "?"):
            self.pos += 1
            bounds: tuple[int, int | None] = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        elif char == "{":
            match = re.compile(r"\{(\d*)(,?)(\d*)\}").match(self.pattern, self.pos)
            if match is None or not (match.group(1) or match.group(3)):
                return None  # a literal "{"
            self.pos = match.end()
            low = int(match.group(1) or 0)
            high = int(match.group(3)) if match.group(3) else (None if match.group(2) else low)
            if high is not None and high < low:
                raise self.fail(f"the quantifier {match.group(0)} has its bounds reversed")
            bounds = (low, high)
        else:
            return None
        if self.peek() in ("?", "+"):  # lazy or possessive: the same strings match
            self.pos += 1
        if bounds[0] > _MAX_REPEAT:
            raise self.fail(f"a repetition of more than {_MAX_REPEAT}")
        return bounds

    def atom(self) -> _Node | None:
        start = self.pos
        char = self.take()
        if char == "(":
            return self.group(start)
        if char == "[":
            return _Char(self.char_class(start))
        if char == ".":
            return _Char(_ANY)
        if char == "^":
            return _Anchor("start")
        if char == "$":
            return _Anchor("end")
        if char == "\\":
            return self.escape(start)
        if char in "*+?" or (char == "{" and self.quantifier_here(start)):
            raise self.fail(f"nothing to repeat before {char!r}", start)
        return _Char(_literal(char))

    def quantifier_here(self, start: int) -> bool:
        self.pos = start
        found = self.quantifier() is not None
        self.pos = start + 1
        return found

    def group(self, start: int) -> _Node | None:
        """What follows a '(': a group of some kind; None for one that writes nothing
        (a comment, flags for the whole pattern)."""
        if self.peek() != "?":
            self.count += 1
            index = self.count
            return self.close(start, index)
        self.pos += 1
        char = self.peek()
        if char == ":" or char == ">":  # non-capturing, atomic
            self.pos += 1
            return self.close(start, None)
        if self.startswith("P<") or (char == "<" and self.peek(1) not in ("=", "!")):
            return self.named_group(start, char)
        if self.startswith("P="):
            return self.named_backref(2, ")", start)
        if char == "#":  # a comment
            end = self.pattern.find(")", self.pos)
            if end < 0:
                raise self.fail("a comment without its ')'", start)
            self.pos = end + 1
            return None
        self.refuse_lookaround(start, char)
        return self.flag_group(start, char)

    def named_group(self, start: int, char: str) -> _Node:
        """`(?P<name>...)`, or `(?<name>...)` (which Python's `re` reads otherwise)."""
        self.foreign = self.foreign or char == "<"
        self.pos += 2 if char == "P" else 1
        end = self.pattern.find(">", self.pos)
        if end < 0:
            raise self.fail("a group name without its '>'", start)
        name = self.pattern[self.pos : end]
        self.pos = end + 1
        self.count += 1
        self.names[name] = self.count
        return self.close(start, self.count)

    def refuse_lookaround(self, start: int, char: str) -> None:
        """Lookarounds and conditionals: `PatternNotSampled`, naming which."""
        two = self.pattern[self.pos : self.pos + 2]
        syntax = char if char in ("=", "!") else two if two in ("<=", "<!") else None
        if syntax is not None:
            kind = "lookbehind" if syntax.startswith("<") else "lookahead"
            negative = "negative " if syntax.endswith("!") else ""
            raise self.fail(f"a {negative}{kind} '(?{syntax}'", start)
        if char == "(":
            raise self.fail("a conditional group '(?('", start)

    def flag_group(self, start: int, char: str) -> _Node | None:
        """Inline flags: `(?i)` for the whole pattern (None), `(?i:...)` for a group."""
        match = re.compile(r"([aiLmsuxU]*)(?:-([imsxU]+))?([:)])").match(self.pattern, self.pos)
        if match is None:
            raise self.fail(f"an unknown group '(?{char}'", start)
        if "x" in match.group(1) + (match.group(2) or ""):
            raise self.fail("verbose mode (the x flag)", start)
        self.pos = match.end()
        if match.group(3) == ")":  # flags for the whole pattern: nothing to write
            return None
        return self.close(start, None)  # flags for this group only

    def close(self, start: int, index: int | None) -> _Node:
        item = self.alternation()
        if self.peek() != ")":
            raise self.fail("a group without its ')'", start)
        self.pos += 1
        if index is not None:
            self.groups[index] = item
        return _Group(item, index)

    def escape(self, start: int) -> _Node:
        char = self.take()
        if char in _CLASS_ESCAPES:
            return _Char(_CLASS_ESCAPES[char])
        kinds = {"b": "word boundary", "B": "not a word boundary", "A": "start", "Z": "end"}
        if char in kinds or char == "z":
            self.foreign = self.foreign or char == "z"
            return _Anchor(kinds.get(char, "end"))
        if char in "123456789":
            digits = char + (self.take() if self.peek().isdigit() else "")
            index = int(digits)
            if index not in self.groups:
                raise self.fail(f"a back-reference \\{digits} to a group not closed yet", start)
            return _Backref(index)
        if char == "k" and self.peek() == "<":
            self.foreign = True
            return self.named_backref(1, ">", start)
        return _Char(self.escaped_char(char, start, in_class=False))

    def escaped_char(self, char: str, start: int, *, in_class: bool) -> _Set:
        """A `\\x` escape that stands for one character (or a category of them)."""
        if char in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[char]
        if char in _CONTROL_ESCAPES:
            return _literal(_CONTROL_ESCAPES[char])
        if char == "b" and in_class:
            return _literal("\b")
        if char == "0":
            digits = ""
            while len(digits) < 2 and self.peek() in "01234567" and self.peek():
                digits += self.take()
            return _literal(chr(int(digits or "0", 8)))
        if char in "xuU":
            return _literal(chr(self.hex_code(char, start)))
        if char in "pP":
            return self.category(char == "P", start)
        if char == "c" and self.peek().isalpha():
            self.foreign = True
            return _literal(chr(ord(self.take()) % 32))
        if char.isalnum():
            raise self.fail(f"the escape '\\{char}', which it does not know", start)
        return _literal(char)

    def hex_code(self, kind: str, start: int) -> int:
        if self.peek() == "{":
            self.foreign = True
            end = self.pattern.find("}", self.pos)
            digits = self.pattern[self.pos + 1 : end] if end > 0 else ""
            self.pos = end + 1
        else:
            width = {"x": 2, "u": 4, "U": 8}[kind]
            digits = self.pattern[self.pos : self.pos + width]
            self.pos += width
        if not digits or any(c not in string.hexdigits for c in digits):
            raise self.fail(f"a malformed '\\{kind}' escape", start)
        code = int(digits, 16)
        if code > 0x10FFFF:
            raise self.fail(f"'\\{kind}{digits}' is beyond Unicode", start)
        return code

    def category(self, negated: bool, start: int) -> _Set:
        self.foreign = True
        if self.peek() == "{":
            end = self.pattern.find("}", self.pos)
            name = self.pattern[self.pos + 1 : end] if end > 0 else ""
            self.pos = end + 1
        else:
            name = self.take()
        name = {"Letter": "L", "Number": "N", "Digit": "Nd", "Alphabetic": "L"}.get(name, name)
        if name not in _CATEGORIES:
            raise self.fail(
                f"the Unicode property '\\{'P' if negated else 'p'}{{{name}}}': only general "
                "categories (L, Lu, Ll, N, Nd, P, S, Z, ...) are known",
                start,
            )
        return _Set(tests=(lambda c: unicodedata.category(c).startswith(name),), negated=negated)

    def char_class(self, start: int) -> _Set:
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        tests: list[Callable[[str], bool]] = []
        first = True
        while True:
            if not self.peek():
                raise self.fail("a class without its ']'", start)
            if self.peek() == "]" and not first:
                self.pos += 1
                break
            first = False
            if self.pattern[self.pos : self.pos + 2] in ("&&", "--", "~~", "||"):
                raise self.fail(
                    f"the class set operation {self.pattern[self.pos : self.pos + 2]!r}", start
                )
            posix = re.compile(r"\[:(\^?)([a-z]+):\]").match(self.pattern, self.pos)
            if posix is not None:
                self.foreign = True
                test = _POSIX.get(posix.group(2))
                if test is None:
                    raise self.fail(f"the POSIX class [:{posix.group(2)}:]", self.pos)
                self.pos = posix.end()
                tests.append(_negation(test) if posix.group(1) else test)
                continue
            if self.peek() == "[":
                raise self.fail("a nested class '[' inside a class", self.pos)
            low = self.class_char()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                high = self.class_char()
                if not (_single(low) and _single(high)):
                    raise self.fail("a range whose end is a class of characters", start)
                lo, hi = low.ranges[0][0], high.ranges[0][0]
                if hi < lo:
                    raise self.fail(f"the range {chr(lo)}-{chr(hi)} is reversed", start)
                ranges.append((lo, hi))
                continue
            ranges.extend(low.ranges)
            if low.tests:
                tests.append(low.allows)  # \D, \W, \S or \p{...} inside a class
        return _Set(tuple(ranges), tuple(tests), negated)

    def class_char(self) -> _Set:
        start = self.pos
        char = self.take()
        if char != "\\":
            return _literal(char)
        return self.escaped_char(self.take(), start, in_class=True)


def _negation(test: Callable[[str], bool]) -> Callable[[str], bool]:
    return lambda char: not test(char)


def _single(chars: _Set) -> bool:
    return not chars.tests and not chars.negated and len(chars.ranges) == 1


# -- lengths and generation --------------------------------------------------------


def _bounds(node: _Node, groups: dict[int, _Node]) -> tuple[int, int | None]:
    """The shortest and longest (None: no limit) strings `node` matches."""
    if isinstance(node, _Char):
        return 1, 1
    if isinstance(node, _Anchor):
        return 0, 0
    if isinstance(node, _Group):
        return _bounds(node.item, groups)
    if isinstance(node, _Backref):
        return _bounds(groups[node.index], groups)
    if isinstance(node, _Seq):
        low = 0
        high_: int | None = 0
        for item in node.items:
            lo, hi = _bounds(item, groups)
            low += lo
            high_ = None if high_ is None or hi is None else high_ + hi
        return low, high_
    if isinstance(node, _Alt):
        all_bounds = [_bounds(o, groups) for o in node.options]
        highs = [hi for _, hi in all_bounds]
        return min(lo for lo, _ in all_bounds), (
            None if any(h is None for h in highs) else max(h for h in highs if h is not None)
        )
    lo, hi = _bounds(node.item, groups)
    if node.high is None:
        return node.low * lo, (0 if hi == 0 else None)
    return node.low * lo, (None if hi is None else node.high * hi)


class _Writer:
    """Writes one string of an exact length for a parsed pattern, or None if it cannot."""

    def __init__(self, groups: dict[int, _Node], picks: dict[int, int]) -> None:
        self.groups = groups
        self.picks = picks  # character position -> which of its options (variants)
        self.sizes: list[int] = []  # how many options each character position had
        self.captured: dict[int, str] = {}

    def write(self, node: _Node, length: int) -> str | None:
        if isinstance(node, _Char):
            if length != 1:
                return None
            options = node.chars.options()
            if not options:
                return None
            position = len(self.sizes)
            self.sizes.append(len(options))
            return options[min(self.picks.get(position, 0), len(options) - 1)]
        if isinstance(node, _Anchor):
            return "" if length == 0 else None
        if isinstance(node, _Group):
            text = self.write(node.item, length)
            if text is not None and node.index is not None:
                self.captured[node.index] = text
            return text
        if isinstance(node, _Backref):
            text = self.captured.get(node.index)
            return text if text is not None and len(text) == length else None
        if isinstance(node, _Seq):
            return self.sequence(list(node.items), length)
        if isinstance(node, _Alt):
            for option in node.options:
                low, high = _bounds(option, self.groups)
                if low <= length and (high is None or length <= high):
                    saved = (len(self.sizes), dict(self.captured))
                    text = self.write(option, length)
                    if text is not None:
                        return text
                    del self.sizes[saved[0] :]
                    self.captured = saved[1]
            return None
        return self.repeat(node, length)

    def sequence(self, items: list[_Node], length: int) -> str | None:
        """The items' strings, `length` characters in all: the spare characters go to
        the first items that can take them, else (a back-reference repeating a group
        must be as long as it) shared out one at a time."""
        bounds = [_bounds(item, self.groups) for item in items]
        spare = length - sum(lo for lo, _ in bounds)
        if spare < 0:
            return None
        for shares in (_first_come(bounds, spare), _round_robin(bounds, spare)):
            if shares is None:
                continue
            saved = (len(self.sizes), dict(self.captured))
            parts = [self.write(item, size) for item, size in zip(items, shares, strict=True)]
            if all(part is not None for part in parts):
                return "".join(part for part in parts if part is not None)
            del self.sizes[saved[0] :]
            self.captured = saved[1]
            if not any(isinstance(item, _Backref) for item in items):
                break  # the other sharing helps only a back-reference
        return None

    def repeat(self, node: _Repeat, length: int) -> str | None:
        low, high = _bounds(node.item, self.groups)
        if high == 0:  # an item that writes nothing
            return self.sequence([node.item] * node.low, 0) if length == 0 else None
        count = max(node.low, -(-length // high) if high is not None else min(length, 1))
        if node.high is not None and count > node.high:
            return None
        if count * low > length or count > _MAX_REPEAT:
            return None
        return self.sequence([node.item] * count, length)


def _first_come(bounds: list[tuple[int, int | None]], spare: int) -> list[int] | None:
    sizes = []
    for low, high in bounds:
        extra = spare if high is None else min(spare, high - low)
        spare -= extra
        sizes.append(low + extra)
    return sizes if spare == 0 else None


def _round_robin(bounds: list[tuple[int, int | None]], spare: int) -> list[int] | None:
    sizes = [low for low, _ in bounds]
    growing = [i for i, (low, high) in enumerate(bounds) if high is None or high > low]
    while spare and growing:
        for i in list(growing):
            if not spare:
                break
            sizes[i] += 1
            spare -= 1
            high = bounds[i][1]
            if high is not None and sizes[i] == high:
                growing.remove(i)
    return sizes if spare == 0 else None


@functools.lru_cache(maxsize=256)
def pattern_search(pattern: str) -> Callable[[str], bool] | None:
    """Whether a string matches `pattern` as JSON schema and pydantic apply it (found
    anywhere in the string), as a function; None where Python's `re` cannot tell (it
    reads the pattern otherwise, or not at all)."""
    try:
        parser = _Parser(pattern)
        parser.parse()
    except PatternNotSampled:
        parser = None
    if parser is not None and parser.foreign:
        return None
    compiled = _compiled(pattern)
    if compiled is None:
        return None
    return lambda text: compiled.search(text) is not None


def _compiled(pattern: str) -> re.Pattern[str] | None:
    """The pattern as Python's `re` reads it, or None where `re` cannot (`\\p{L}`, say)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FutureWarning: "possible nested set"
            return re.compile(pattern)
    except re.error:
        return None


def sample_pattern(
    pattern: str, *, min_length: int = 0, max_length: int | None = None, variant: int = 0
) -> str | None:
    """A string `pattern` finds (as `re.search` does), of `min_length` to `max_length`
    characters. `variant=k`: the k-th other such string of that length, None if the
    pattern has fewer. Raises `PatternNotSampled` (what it cannot follow, and where)."""
    parser = _Parser(pattern)
    tree = parser.parse()
    sampler = _Sampler(
        tree, parser.groups, None if parser.foreign else _compiled(pattern), min_length, max_length
    )
    low, high = _bounds(tree, parser.groups)
    start = max(low, min_length)
    stop = min(x for x in (high, max_length, start + _SEARCH_SPAN) if x is not None)
    shortest: str | None = None
    for length in range(start, stop + 1):
        text = sampler.write(length, variant)
        if text is None:
            if variant and sampler.write(length, 0) is not None:
                return None  # the length works, with fewer variants than asked for
            continue
        if sampler.fits(text):
            return text
        shortest = shortest or text
    # A pattern is searched for, not matched whole: an unanchored one may be padded.
    base = shortest or sampler.write(low, variant)
    padded = sampler.padded(base)
    if padded is not None:
        return padded
    raise _not_sampled(pattern, (low, high), min_length, max_length, base)


class _Sampler:
    """Writes strings of a parsed pattern and tells which fit the lengths asked for and
    the pattern itself (`check`: Python's `re`, where it reads the pattern as meant)."""

    def __init__(
        self,
        tree: _Node,
        groups: dict[int, _Node],
        check: re.Pattern[str] | None,
        min_length: int,
        max_length: int | None,
    ) -> None:
        self.tree, self.groups, self.check = tree, groups, check
        self.min_length, self.max_length = min_length, max_length

    def write(self, length: int, variant: int) -> str | None:
        return _write(self.tree, self.groups, length, variant)

    def fits(self, text: str) -> bool:
        if len(text) < self.min_length:
            return False
        if self.max_length is not None and len(text) > self.max_length:
            return False
        return self.check is None or self.check.search(text) is not None

    def padded(self, base: str | None) -> str | None:
        """`base` padded with "a"s to `min_length`, after or before it, if that fits."""
        if base is None or self.check is None or len(base) >= self.min_length:
            return None
        pad = "a" * (self.min_length - len(base))
        return next((t for t in (base + pad, pad + base) if self.fits(t)), None)


def _not_sampled(
    pattern: str,
    bounds: tuple[int, int | None],
    min_length: int,
    max_length: int | None,
    base: str | None,
) -> PatternNotSampled:
    """Why no string of the lengths asked for was found."""
    low, high = bounds
    if high is not None and high < min_length:
        return PatternNotSampled(
            pattern,
            f"its longest match has {high} characters, fewer than minLength {min_length}",
        )
    if max_length is not None and low > max_length:
        return PatternNotSampled(
            pattern,
            f"its shortest match has {low} characters, more than maxLength {max_length}",
        )
    wanted = f"{min_length} to {max_length}" if max_length is not None else f"{min_length} or more"
    return PatternNotSampled(
        pattern,
        f"no string of {wanted} characters that it matches was found"
        + ("" if base is None else f" (the closest tried: {base!r})"),
    )


def _write(tree: _Node, groups: dict[int, _Node], length: int, variant: int) -> str | None:
    """The string of `length` characters for `variant`: the positions count like an
    odometer, the last one fastest."""
    first = _Writer(groups, {})
    text = first.write(tree, length)
    if text is None or variant == 0:
        return text
    picks: dict[int, int] = {}
    left = variant
    for position in range(len(first.sizes) - 1, -1, -1):
        left, picks[position] = divmod(left, first.sizes[position])
    if left:
        return None
    return _Writer(groups, picks).write(tree, length)
