"""Times shown to people and kept in receipts: ISO 8601 in UTC, to the millisecond (``2026-12-02T09:41:00.123Z``),
beside the epoch milliseconds that scripts already read."""

from __future__ import annotations

import datetime as dt

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def iso_ms(ms: int | None) -> str:
    """``ms`` (epoch milliseconds) as ISO 8601 UTC; ``""`` for none (``None`` or 0: not happened yet)."""
    if not ms:
        return ""
    # Integer arithmetic: ``fromtimestamp(ms / 1000)`` rounds some milliseconds away (a float of seconds).
    return (EPOCH + dt.timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
