"""``msgpack``: a msgpack map per record; the same options as ``json``."""

from __future__ import annotations

from typing import Any

import msgpack

from shale.encoder.parsers.base import ParseError
from shale.encoder.parsers.jsonparser import JsonTimestampParser


class MsgpackParser(JsonTimestampParser):
    name = "msgpack"
    approximate = False  # msgpack keeps every integer as it was packed

    def decode(self, value: bytes) -> Any:
        try:
            return msgpack.unpackb(value, raw=False, timestamp=0)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ParseError(f"invalid msgpack: {exc}") from None
        except RecursionError:
            raise ParseError("the msgpack value is nested too deeply to read") from None

    def decode_numbers(self, value: bytes) -> Any:
        """msgpack floats are binary: a decimal column reads one from its shortest text (``repr``)."""
        return self.decode(value)
