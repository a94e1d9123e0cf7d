"""Erasure: remove every record of one key from a tenant's blocks, and prove it (docs/DESIGN.md, "Erasure")."""

from shale.erase.api import (
    ErasureNotReadyError,
    ErasureReport,
    ErasureRequest,
    check_delete_delay,
    column_request,
    erase,
    erasure_status,
    lag_text,
)
from shale.erase.column import ColumnValueError
from shale.erase.leftover import Leftover, LeftoverScan, Needle, audit, scan_leftovers
from shale.erase.receipt import ReceiptNotReadyError, write_receipt
from shale.erase.scan import Match, find_matches
from shale.erase.times import iso_ms

__all__ = ["ColumnValueError", "ErasureNotReadyError", "ErasureReport", "ErasureRequest", "Leftover", "LeftoverScan",
           "Match", "Needle", "ReceiptNotReadyError", "audit", "check_delete_delay", "column_request", "erase",
           "erasure_status", "find_matches", "iso_ms", "lag_text", "scan_leftovers", "write_receipt"]
