"""Erasure: remove every record of one key from a tenant's blocks, and prove it (docs/DESIGN.md, "Erasure")."""

from shale.erase.api import ErasureReport, ErasureRequest, erase, erasure_status
from shale.erase.receipt import ReceiptNotReadyError, write_receipt
from shale.erase.scan import Match, find_matches

__all__ = ["ErasureReport", "ErasureRequest", "Match", "ReceiptNotReadyError", "erase", "erasure_status",
           "find_matches", "write_receipt"]
