"""Value types shared by the configuration model: durations and byte sizes written the way people write them."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_SIZE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def parse_duration(value: object) -> float:
    """Seconds from ``90``, ``"90s"``, ``"15m"``, ``"1h30m"``, ``"250ms"`` or ``"7d"``."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '15m'")
    if isinstance(value, int | float):
        return _bounded(float(value))
    if not isinstance(value, str):
        raise ValueError("a duration must be a number of seconds or a string like '15m'")
    text = value.strip().lower()
    if text in ("0", ""):
        return 0.0
    pos, total = 0, 0.0
    for match in _DURATION_RE.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"{value!r} is not a duration; write it like '250ms', '30s', '15m', '6h' or '7d'")
    return _bounded(total)


MAX_DURATION = 100 * 366 * 86400.0
"""A century: longer is a mistake (and ``inf`` or ``nan`` would overflow or never compare)."""


def _bounded(seconds: float) -> float:
    if math.isnan(seconds):
        raise ValueError("a duration cannot be NaN")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if seconds > MAX_DURATION:
        raise ValueError(f"a duration cannot be longer than a century ({MAX_DURATION:.0f} s)")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from ``1048576``, ``"64MiB"``, ``"1GB"`` or ``"512kib"``."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '64MiB'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if isinstance(value, str):
        match = _SIZE_RE.match(value.lower())
        if match and match.group(2) in _SIZE_UNITS:
            return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
    raise ValueError(f"{value!r} is not a size; write it like '1048576', '512KiB', '64MiB' or '1GB'")


_SPELLED_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_SIZE_SPELLED = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def format_duration(seconds: float) -> str:
    """``seconds`` the way people write it, which ``parse_duration`` reads back exactly: ``"15m"``, ``"1h30m"``,
    ``"250ms"``, ``"1.5s"``, ``"0s"`` (the configuration reference shows defaults this way)."""
    if seconds == int(seconds):
        rest, parts = int(seconds), []
        for unit, size in _SPELLED_UNITS:
            count, rest = divmod(rest, size)
            if count:
                parts.append(f"{count}{unit}")
        return "".join(parts) or "0s"
    millis = seconds * 1000
    if seconds < 1 and millis == int(millis) and parse_duration(f"{int(millis)}ms") == seconds:
        return f"{int(millis)}ms"
    # Decimal of the shortest repr: positional digits (never "1e-05", which the parser refuses), read back exactly.
    return format(Decimal(repr(seconds)), "f") + "s"


def format_size(size: int) -> str:
    """``size`` bytes the way people write it, which ``parse_size`` reads back exactly: ``"64MiB"``, ``"1GiB"``,
    or the number of bytes when no binary unit divides it."""
    for unit, factor in _SIZE_SPELLED:
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def check_regex(value: str) -> str:
    """A Python regular expression, compiled once here so a typo fails at load time, not on the first topic."""
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return value


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, written as a number or as a string like ``"15m"``."""

ByteSize = Annotated[int, BeforeValidator(parse_size)]
"""Bytes, written as a number or as a string like ``"64MiB"``."""

Regex = Annotated[str, AfterValidator(check_regex)]
"""A Python regular expression (checked when the configuration loads)."""
