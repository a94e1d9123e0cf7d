"""``shale.read``: stored records as one Arrow table, from a configuration, in one call (the analyst's door).

    import shale
    table = shale.read("shale.toml", tenant="acme", selector='{topic="billing"}', start="2026-11-01", end="now")

Times are what ``shale query`` takes (``now``, ``-1h``, ``2026-11-22``, ISO 8601, epoch milliseconds) or a
``datetime`` (naive means UTC); the table's times are Arrow UTC timestamps (``to_pandas()`` gives datetimes). The
whole answer is held in memory: for large reads stream with ``run_query`` or use Spark (``docs/READING.md``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from shale.config import ShaleConfig, load_config
from shale.objstore import open_bucket
from shale.query.latest import PROCESS_READS, read_latest, store_name
from shale.query.reader import Query, run_query
from shale.query.sources import open_source
from shale.query.times import parse_time

Moment = str | int | dt.datetime


def _ms(moment: Moment) -> int:
    if isinstance(moment, dt.datetime):
        aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)
        return int(aware.timestamp() * 1000)
    if isinstance(moment, int):
        return moment
    return parse_time(moment)


def read(config: ShaleConfig | str | Path | None = None, *, tenant: str, selector: str = "{}",
         start: Moment = "-1h", end: Moment = "now", group: str = "partition", quarantine: bool = False,
         columns: Sequence[str] | None = None, source: str = "metastore", latest: bool = False,
         as_of: Moment | None = None) -> pa.Table:
    """The records of ``tenant`` matching ``selector`` in ``[start, end]``, as ``shale query`` returns them.

    ``config``: a loaded configuration, a TOML file's path, or None for the usual lookup (``$SHALE_CONFIG``,
    ``./shale.toml``, ``SHALE_*`` variables). ``source``: ``metastore`` or ``bucket-index``. ``latest``: the
    latest row per key of the selected change tables (upsert or Debezium topics; ``start`` and ``end`` are not
    used), as they stood at ``as_of`` (a Kafka record time; default: now), as ``shale query --latest`` returns
    them (docs/design/change-tables.md)."""
    loaded = config if isinstance(config, ShaleConfig) else load_config(None if config is None else Path(config))
    if as_of is not None and not latest:
        raise ValueError("as_of is the time of a latest view: pass latest=True with it")
    query = Query(tenant, _ms(start), _ms(end), selector, group=group,
                  kind="quarantine" if quarantine else "records", columns=list(columns) if columns else None,
                  default_generation=loaded.ingest.generation)
    bucket = open_bucket(loaded.bucket)
    if latest:
        view, _ = read_latest(query, open_source(loaded, source, bucket), bucket, loaded.ingest.parsers,
                              None if as_of is None else _ms(as_of), PROCESS_READS, store_name(loaded))
        return view
    return run_query(query, open_source(loaded, source, bucket), bucket).read_all()
