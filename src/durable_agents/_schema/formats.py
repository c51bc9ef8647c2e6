"""The string `format`s the kit knows: a valid value of each (`FORMATS`), whether a
string is one (`format_fits`), and the values a caller steers a format to instead
(`steered_formats`: `TestLLM(values=...)`, `check_agent(..., values=...)`).

The generator writes these values (`values.py`); the check holds a string to its
format when asked (`check.py`). Guide: docs/testing.md ("Steering the values").
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigurationError

__all__ = ["FORMATS", "PRESETS", "Steer", "format_fits", "steered_formats"]


def _date(variant: int) -> datetime.date:
    return datetime.date(2000, 1, 1) + datetime.timedelta(days=variant)


def _uuid(version: int) -> Callable[[int], str]:
    return lambda v: f"00000000-0000-{version}000-8000-{v:012x}"


def _email(v: int) -> str:
    return f"user{v or ''}@example.com"


def _url(v: int) -> str:
    return f"https://example.com/{v or ''}"


def _hostname(v: int) -> str:
    return f"host{v}.example.com" if v else "example.com"


def _ipv4(v: int) -> str:
    return str(ipaddress.IPv4Address(0x7F000001 + v))


def _ipv6(v: int) -> str:
    return str(ipaddress.IPv6Address(1 + v))


def _ipv4_network(v: int) -> str:
    return f"10.{v % 256}.0.0/16"


def _base64(v: int) -> str:
    return ["YWJj", "YWJk", "YWJl"][v] if v < 3 else f"YWJj{v:04d}"


# A valid value of each string format pydantic writes (date, UUID, HttpUrl, ...) or
# JSON schema names; the variant makes the k-th other one. Formats that accept the
# same values share one maker.
FORMATS: Mapping[str, Callable[[int], str]] = {
    "date-time": lambda v: f"{_date(v).isoformat()}T00:00:00Z",
    "date": lambda v: _date(v).isoformat(),
    "time": lambda v: (
        (datetime.datetime(2000, 1, 1) + datetime.timedelta(seconds=v)).time().isoformat()
    ),
    "duration": lambda v: f"PT{v}S",
    "uuid": _uuid(4),
    **{f"uuid{n}": _uuid(n) for n in (1, 3, 4, 5, 6, 7, 8)},
    **dict.fromkeys(("email", "idn-email"), _email),
    **dict.fromkeys(
        ("uri", "url", "iri", "uri-reference", "iri-reference", "multi-host-uri"), _url
    ),
    **dict.fromkeys(("hostname", "idn-hostname"), _hostname),
    **dict.fromkeys(("ipv4", "ipvanyaddress"), _ipv4),
    "ipv6": _ipv6,
    **dict.fromkeys(("ipv4network", "ipvanynetwork"), _ipv4_network),
    "ipv6network": lambda v: f"fd00:{v:x}::/32",
    **dict.fromkeys(("ipv4interface", "ipvanyinterface"), lambda v: f"{_ipv4(v)}/8"),
    "ipv6interface": lambda v: f"{_ipv6(v)}/128",
    "json-pointer": lambda v: f"/a{v or ''}",
    "relative-json-pointer": lambda v: str(v),
    "regex": lambda v: f"a{v or ''}",
    **dict.fromkeys(("base64", "base64url", "byte"), _base64),
}

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_DURATION = re.compile(
    r"^P(?!$)(\d+Y)?(\d+M)?(\d+W)?(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?$"
)


def format_fits(name: str, text: str) -> bool:
    """Whether `text` is a valid `name` (formats it does not know: yes)."""
    try:
        if name == "date":
            datetime.date.fromisoformat(text)
        elif name == "date-time":
            datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        elif name == "time":
            datetime.time.fromisoformat(text.replace("Z", "+00:00"))
        elif name == "uuid" or (name.startswith("uuid") and name[4:].isdigit()):
            value = uuid.UUID(text)
            return name == "uuid" or value.version == int(name[4:])
        elif name == "ipv4":
            ipaddress.IPv4Address(text)
        elif name == "ipv6":
            ipaddress.IPv6Address(text)
        elif name in ("email", "idn-email"):
            return _EMAIL.match(text) is not None
        elif name in ("hostname", "idn-hostname"):
            return _HOSTNAME.match(text) is not None
        elif name in ("uri", "url", "iri", "multi-host-uri"):
            parts = urlsplit(text)
            return bool(parts.scheme and parts.netloc)
        elif name == "duration":
            return _DURATION.match(text) is not None
    except ValueError:
        return False
    return True


# -- steering: values= ------------------------------------------------------------------

Steer = Callable[[datetime.datetime, int], Any]
"""A steered format's values: `steer(now, variant)`, the `variant`-th value (a string) at
time `now` (aware, UTC), or None when it has no such variant."""

PRESETS = {"future": 1, "past": -1}
"""The named values of the formats `date` and `date-time`: a day a week from the run's
`now` (midnight UTC for a date-time), then a day further for each other value."""

_PRESET_DAYS = 7
_PRESET_FORMATS = ("date", "date-time")
# Types whose format pydantic writes only with an optional package installed.
_KNOWN_TYPES = {"EmailStr": "email", "NameEmail": "name-email"}


def steered_formats(values: Mapping[Any, Any] | None) -> dict[str, Steer]:
    """`values=` as the generator takes it: each key as the JSON-schema format it steers
    (a Python type as the format pydantic writes for it: `datetime` is "date-time"),
    each value as a `Steer`. A value is a preset (`PRESETS`, for dates), a function of
    `now` (an aware UTC datetime) or a constant, either a string or what JSON writes as
    one (a datetime, a UUID...). `ConfigurationError` for a key with no format, a preset
    of a format that has none, or a constant that is not a string."""
    steers: dict[str, Steer] = {}
    named: dict[str, object] = {}
    for key, value in (values or {}).items():
        form = _format_of(key)
        if form in steers:
            raise ConfigurationError(
                f"values= steers the format {form!r} twice: by {named[form]!r} and by {key!r}"
            )
        named[form] = key
        steers[form] = _steer(form, value)
    return steers


def _format_of(key: Any) -> str:
    """The JSON-schema format a key of `values=` names."""
    if isinstance(key, str) and key.strip():
        return key.strip()
    # pydantic imported here, not above: this module loads with the Worker, which never
    # steers a value (and pydantic.networks is no small import).
    from pydantic import TypeAdapter

    pydantics = isinstance(key, type) and key.__module__ == "pydantic.networks"
    if pydantics and key.__name__ in _KNOWN_TYPES:
        return _KNOWN_TYPES[key.__name__]
    form = None
    if not isinstance(key, str):
        try:
            form = TypeAdapter(key).json_schema().get("format")
        except Exception:  # not a type pydantic knows (or one that needs a package)
            form = None
    if isinstance(form, str):
        return form
    raise ConfigurationError(
        f'values= keys are JSON-schema formats ("date-time", "date", "email", '
        f'"uuid", ...) or the Python types pydantic writes with one (datetime, date, '
        f"EmailStr, UUID, HttpUrl, ...); {getattr(key, '__name__', key)!r} has no format. "
        "To fix other values, pass the tool's arguments by hand (arguments=)"
    )


def _steer(form: str, value: Any) -> Steer:
    if isinstance(value, str) and value in PRESETS:
        if form not in _PRESET_FORMATS:
            raise ConfigurationError(
                f"values={{{form!r}: {value!r}}}: the presets {sorted(PRESETS)} are for the "
                f"formats {list(_PRESET_FORMATS)} (datetime, date); give {form!r} a value, "
                "or a function of now"
            )
        sign = PRESETS[value]
        return lambda now, variant: _days_from(now, sign * (_PRESET_DAYS + variant), form)
    if callable(value) and not isinstance(value, type):
        return lambda now, variant: None if variant else json_string(value(now))
    try:
        constant = json_string(value)
    except TypeError as exc:
        raise ConfigurationError(f"values={{{form!r}: ...}}: {exc}") from None
    return lambda now, variant: None if variant else constant


def _days_from(now: datetime.datetime, days: int, form: str) -> str:
    day = now.astimezone(datetime.UTC).date() + datetime.timedelta(days=days)
    return day.isoformat() if form == "date" else f"{day.isoformat()}T00:00:00Z"


def json_string(value: Any) -> str:
    """`value` as JSON writes it, which must be a string (a datetime's ISO text, a UUID's
    hex form...); TypeError otherwise."""
    if isinstance(value, str):
        return value
    from pydantic_core import to_jsonable_python  # (see _format_of)

    try:
        made = to_jsonable_python(value)
    except Exception:  # pydantic_core's PydanticSerializationError: not a JSON value
        made = value
    if not isinstance(made, str):
        raise TypeError(
            f"{value!r} is not a string, nor a value JSON writes as one (a datetime, a "
            "date, a UUID, ...)"
        )
    return made
