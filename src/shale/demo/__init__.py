"""The demo pipeline (``run_demo``, imported on first use: the pipeline imports the development services) and its
data: 2,000-line samples of six real system logs from Loghub (``samples``; see loghub/README.md and loghub/LICENSE:
free for research use; cite the Loghub paper; keep the notice)."""

import typing as _typing

from shale.demo.samples import LOGHUB, LOGHUB_FORMATS, loghub_lines
from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.demo.pipeline import run_demo

__getattr__ = _lazy_exports(__name__, {"run_demo": "pipeline"})

__all__ = ["LOGHUB", "LOGHUB_FORMATS", "loghub_lines", "run_demo"]
