"""The string `format`s the kit knows: a valid value of each (`FORMATS`), and whether
a string is one (`format_fits`).

The generator writes these values (`values.py`); the check holds a string to its
format when asked (`check.py`). Guide: docs/testing.md.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import uuid
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

__all__ = ["FORMATS", "format_fits"]


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
