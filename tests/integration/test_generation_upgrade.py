"""A zero-downtime upgrade (seed 002) on real Kafka and Spark: generation 1 ingested a topic; generation 2 (the
upgraded parser, ``ingest.generation = 2``) starts beside it from Kafka's log start. After every one of its batches
a query still returns every record, from generation 1, until the batch that catches up switches readers to
generation 2; an operator's switch back to generation 1 then stays through generation 2's later batches
(issue 39 case 9)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from tests.integration.ingest_helpers import JSON_PARSER, config_of, create_topic, produce_json, write_config

from shale.ingest.job import IngestJob
from shale.metastore import SetActiveGeneration, open_metastore
from shale.metastore.rules.generations import OPEN_END
from shale.objstore import open_bucket
from shale.query import Query, run_query

UPGRADED = {"parser": "json", "options": {**JSON_PARSER["options"], "fields": ["msg", "ts"]}}
"""Generation 2's parser: it also stores ``ts`` (a column generation 1 does not have, so a row says its generation)."""


def test_case9_an_upgrade_keeps_every_record_queryable_and_a_switch_back_stays(kafka, minio_bucket, spark,
                                                                              tmp_path: Path) -> None:
    topic = f"upgrade-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    produce_json(kafka.bootstrap_servers, topic, 600)
    (tmp_path / "g1").mkdir()
    (tmp_path / "g2").mkdir()
    first = config_of(write_config(tmp_path / "g1", kafka.bootstrap_servers, minio_bucket, [topic]))
    second = config_of(write_config(tmp_path / "g2", kafka.bootstrap_servers, minio_bucket, [topic],
                                    metastore={"data_dir": str(tmp_path / "g1" / "metastore")},
                                    parsers_override=[UPGRADED], generation=2, max_records_per_batch=150))
    metastore = open_metastore(first)
    bucket = open_bucket(first.bucket)

    def query() -> pa.Table:
        return run_query(Query("default", 0, OPEN_END, f'{{topic="{topic}"}}'), metastore, bucket).read_all()

    def serving() -> int:
        return [g for t, _, end, g in metastore.generation_rules("default") if t == topic and end >= OPEN_END][-1]

    IngestJob(first, "partition", spark=spark, metastore=metastore).run(available_now=True)
    assert query().num_rows == 600
    assert serving() == 1

    # Generation 2 beside it, observed after every batch it commits.
    seen: list[tuple[int, int, int, bool]] = []  # (offsets generation 2 committed, rows, serving, rows of gen 2)
    upgrade = IngestJob(second, "partition", spark=spark, metastore=metastore)
    batch = upgrade.run_batch

    def observed(plan: Any) -> str:
        outcome = batch(plan)
        rows = query()
        done = sum(o.committed_end for o in metastore.offsets("partition", 2) if o.topic == topic)
        seen.append((done, rows.num_rows, serving(), "ts" in rows.column_names))
        return outcome

    upgrade.run_batch = observed  # type: ignore[method-assign]
    upgrade.run(available_now=True)
    catching_up = [s for s in seen if s[0] < 600]
    assert catching_up, seen  # batches of 150 records: it took several to catch up
    assert all(rows == 600 and now == 1 and not new for _, rows, now, new in catching_up), seen
    assert seen[-1][:3] == (600, 600, 2), seen
    upgraded = query()
    assert upgraded.column("ts").null_count == 0  # every row read from generation 2 now
    assert metastore.generation_rules("default")[-1] == (topic, 0, OPEN_END, 2)  # it holds every offset

    # The operator switches back; generation 2 goes on ingesting and never undoes it.
    back = metastore.submit(SetActiveGeneration(tenant="default", topic=topic, generation=1, start=0, end=OPEN_END))
    assert back.ok, back
    produce_json(kafka.bootstrap_servers, topic, 100, start=600, seed=2)
    IngestJob(second, "partition", spark=spark, metastore=metastore).run(available_now=True)
    assert serving() == 1
    assert metastore.generation_rules("default")[-1] == (topic, 0, OPEN_END, 1)
    rows = query()
    assert rows.num_rows == 600  # generation 1 has not read the new records yet
    assert "ts" not in rows.column_names
    IngestJob(first, "partition", spark=spark, metastore=metastore).run(available_now=True)
    assert query().num_rows == 700
    assert serving() == 1
