"""Times as people write them in queries: ``now``, ``-15m`` (relative to now), ``2026-11-22``,
``2026-11-22T10:00:00Z`` or epoch milliseconds."""

from __future__ import annotations

import datetime as dt
import time

from shale.config import parse_duration


def parse_time(text: str, now: float | None = None) -> int:
    """Milliseconds since the epoch; a ValueError that shows the accepted forms otherwise."""
    now = time.time() if now is None else now
    value = text.strip()
    try:
        if value == "now":
            return int(now * 1000)
        if value.startswith("-"):
            return int((now - parse_duration(value[1:])) * 1000)
        if value.isdigit():
            return int(value)
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"time {text!r} is not understood; use now, -15m, 2026-11-22, 2026-11-22T10:00:00Z or "
                         "epoch milliseconds") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)
