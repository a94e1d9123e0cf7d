"""``shale erase``: erase every record of one key (or a typed column's value) from a tenant's blocks (dry run
unless ``--yes``), ``shale erase status ID [--receipt]`` and ``shale erase audit ID`` (the receipt's leftover scan
run again)."""

from __future__ import annotations

import base64
import binascii
import json
import os
import sys
from typing import TYPE_CHECKING

import click

from shale.cli.common import get_config, shale_errors

if TYPE_CHECKING:
    from shale.erase import ErasureReport


def _key(text: str | None, hex_text: str | None, b64_text: str | None, from_stdin: bool) -> bytes:
    given = [k for k in (text, hex_text, b64_text) if k is not None] + ([True] if from_stdin else [])
    if len(given) != 1:
        raise click.UsageError("give the key once: --key TEXT, --key-hex HEX, --key-base64 B64 or --key-stdin")
    try:
        if hex_text is not None:
            return bytes.fromhex(hex_text)
        if b64_text is not None:
            return base64.b64decode(b64_text, validate=True)
    except (ValueError, binascii.Error) as exc:
        raise click.BadParameter(f"the key is not valid: {exc}") from None
    if from_stdin:
        return sys.stdin.buffer.read().removesuffix(b"\n")  # one newline, as an echo adds: a key may end in 0x0A
    assert text is not None
    return text.encode()


def _local_user() -> str:
    import getpass
    import socket

    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"[:200]
    except (KeyError, OSError):
        return f"uid {os.getuid()}@{socket.gethostname()}"[:200]


@click.group(invoke_without_command=True)
@click.option("--tenant", default=None, help="The tenant whose blocks hold the records (required).")
@click.option("--topic", "topics", multiple=True, help="A topic to erase from (repeat; default: every topic).")
@click.option("--key", default=None, help="The record key, as text (UTF-8).")
@click.option("--key-hex", default=None, help="The record key's bytes, in hex.")
@click.option("--key-base64", default=None, help="The record key's bytes, in base64.")
@click.option("--key-stdin", is_flag=True, help="Read the key's bytes from standard input (keeps it off the "
                                                "command line; one trailing newline is dropped).")
@click.option("--column", default=None, help="Erase by a typed column's value instead of a key: the column's path "
                                             "in the partition group (customer.id).")
@click.option("--value", default=None, help="With --column: the value, as text read as the column's type.")
@click.option("--value-stdin", is_flag=True, help="With --column: read the value from standard input (keeps it off "
                                                  "the command line; one trailing newline is dropped).")
@click.option("--no-kafka", is_flag=True, help="Do not ask Kafka for the high watermarks (the topics are gone, or "
              "Kafka cannot be reached): every record of the key backed up when the request is made is erased (one "
              "ingested later is new data: run the request again for it).")
@click.option("--delete-delay", default=None, help="A shorter delete delay for the replaced blocks' objects "
              "('1h'; default block.delete_delay): at least bucket_index.max_stale_period, block.sync_delay and "
              "metastore.query_timeout, since readers may still use them that long.")
@click.option("--wait", default="2m", show_default=True, help="How long to wait, before committing the request, "
              "for the scanned group to index every record below the high watermarks (the backup group commits "
              "every ingest.backup_trigger_interval; a commit may wait in the dead letter queue); past it, exit 3 "
              "with nothing committed.")
@click.option("--yes", is_flag=True, help="Erase. Without it, a dry run: the blocks and records it would erase.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@shale_errors
def erase(ctx: click.Context, tenant: str | None, topics: tuple[str, ...], key: str | None, key_hex: str | None,
          key_base64: str | None, key_stdin: bool, column: str | None, value: str | None, value_stdin: bool,
          no_kafka: bool, delete_delay: str | None, wait: str, yes: bool, as_json: bool) -> None:
    """Erase every record of one key (GDPR article 17): the request is committed to the metastore with the
    Kafka high watermarks, the backup group is scanned for the key, and every block of both groups holding one of
    its records is rewritten without it by the compaction workers (`shale compact`). With --column and --value, the
    records whose typed column holds the value are erased instead: the partition group is scanned for it and the
    backup group's records at the same Kafka offsets go too. Before it commits the request, it waits (--wait) until
    the scanned group has indexed every record below the watermarks; exit 3 if it has not. Needs admin. The same
    request made again once the first is past `requested` is a new erasure (the key's records produced since); a
    run killed before its plan is resumed. `shale erase status ID` shows the progress."""
    from dataclasses import replace

    from shale.config import parse_duration
    from shale.erase import ErasureNotReadyError, ErasureRequest, check_delete_delay, column_request
    from shale.erase import erase as run_erasure
    from shale.metastore import open_index_view, open_metastore

    if ctx.invoked_subcommand is not None:
        return
    if not tenant:
        raise click.UsageError("--tenant is required")
    config = get_config(ctx)
    delay = 0.0
    if delete_delay is not None:
        try:
            delay = check_delete_delay(config, parse_duration(delete_delay))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--delete-delay") from None
    metastore = open_metastore(config) if yes else open_index_view(config)
    if column is not None:
        if any(k is not None for k in (key, key_hex, key_base64)) or key_stdin:
            raise click.UsageError("give a key or --column with --value, not both")
        if (value is None) == (not value_stdin):
            raise click.UsageError("--column needs the value once: --value TEXT or --value-stdin")
        text = sys.stdin.read().removesuffix("\n") if value_stdin else value
        assert text is not None
        request = column_request(metastore, tenant, column, text, topics)
    elif value is not None or value_stdin:
        raise click.UsageError("--value needs --column")
    else:
        request = ErasureRequest(tenant=tenant, key=_key(key, key_hex, key_base64, key_stdin), topics=topics)
    try:
        report = run_erasure(metastore, config.bucket, replace(request, delete_delay=delay),
                             kafka=None if no_kafka else config.kafka, dry_run=not yes, by=_local_user(),
                             wait=parse_duration(wait))
    except ErasureNotReadyError as exc:
        click.echo(f"not requested yet: {exc}", err=True)
        sys.exit(3)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report_text(report))


@erase.command("status")
@click.argument("erasure")
@click.option("--receipt", is_flag=True, help="Once rewritten and the replaced objects are gone: scan once more "
                                              "(the index's blocks, then every object under the tenant's prefixes), "
                                              "write the receipt to the bucket (once) and print it.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@shale_errors
def status(ctx: click.Context, erasure: str, receipt: bool, as_json: bool) -> None:
    """An erasure's request, state, the blocks rewritten and the jobs left. Exit 0 when it is rewritten (or done,
    with its receipt), 3 while it is not. With --receipt: 3 while the receipt must wait (jobs left, objects the
    metastore leader will delete), 1 when the scans find what nothing will delete (the objects are named)."""
    from shale.erase import ReceiptNotReadyError, erasure_status, write_receipt
    from shale.iceberg import receipt_check
    from shale.metastore import open_index_view, open_metastore
    from shale.objstore import open_bucket

    config = get_config(ctx)
    if receipt:
        try:
            bucket = open_bucket(config.bucket)
            written = write_receipt(open_metastore(config), bucket, erasure, kafka=config.kafka,
                                    iceberg=receipt_check(config, bucket) if config.iceberg.enabled else None)
        except ReceiptNotReadyError as exc:
            click.echo(f"no receipt yet: {exc}", err=True)
            sys.exit(3)
        click.echo(json.dumps(written, indent=2))
        return
    report = erasure_status(open_index_view(config), erasure)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report_text(report))
    if report.state not in ("rewritten", "done"):
        sys.exit(3)


@erase.command("audit")
@click.argument("erasure")
@click.option("--tenant", default=None, help="The erasure's tenant (default: asked of the metastore).")
@click.option("--json", "as_json", is_flag=True, help="Print the scan as JSON.")
@click.pass_context
@shale_errors
def audit(ctx: click.Context, erasure: str, tenant: str | None, as_json: bool) -> None:
    """Run an erasure's leftover scan again, against its receipt in the bucket: every object under the tenant's
    prefixes read for the key's SHA-256 (or the column value's) and the erased positions. Needs no key and writes
    nothing. Exit 0 when nothing is left, 1 when something is (the objects are named; the key never is)."""
    from shale.block import erasure_receipt_key
    from shale.erase import audit as audit_scan
    from shale.errors import NotFoundError
    from shale.metastore import open_index_view
    from shale.objstore import open_bucket

    config = get_config(ctx)
    if tenant is None:
        rows = open_index_view(config).erasures(erasure)
        if not rows:
            raise NotFoundError(f"no erasure {erasure}")
        tenant = str(rows[0]["tenant"])
    bucket = open_bucket(config.bucket)
    try:
        receipt = json.loads(bucket.get(erasure_receipt_key(tenant, erasure)))
    except NotFoundError:
        raise NotFoundError(f"erasure {erasure} of tenant {tenant} has no receipt yet (`shale erase status "
                            f"{erasure} --receipt` writes it)") from None
    scan = audit_scan(bucket, receipt)
    summary = scan.summary() | {"erasure": erasure, "tenant": tenant, "key_sha256": receipt["key_sha256"],
                                "found": [f.to_dict() for f in scan.leftovers], "unreadable_objects": scan.unreadable}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"erasure {erasure}: searched {scan.objects_read} of {scan.objects} objects "
                   f"({scan.bytes} bytes) under {', '.join(scan.prefixes)}; read {scan.bytes_read} bytes")
        for f in scan.leftovers:
            click.echo(f"  LEFT {f.object} ({f.kind}{', ' + f.state if f.state else ''}): a record at "
                       f"{f.topic}[{f.partition}]@{f.offset}, by its {f.why}")
        for key in scan.unreadable:
            click.echo(f"  UNREADABLE {key}: cannot be shown free of the key")
        click.echo("nothing left" if not (scan.leftovers or scan.unreadable) else
                   f"{len(scan.leftovers)} records left, {len(scan.unreadable)} objects unreadable")
    if scan.leftovers or scan.unreadable:
        sys.exit(1)


def report_text(report: ErasureReport) -> str:
    """The report for people (``--json`` gives every field); times in ISO 8601 UTC."""
    from shale.erase import iso_ms, lag_text

    head = (f"erasure {report.id}: " + ("dry run, nothing changed" if report.dry_run else report.state)
            + (" (another run made this erasure meanwhile: this is its state)" if report.replay else ""))
    lines = [head]
    if report.previous:
        lines.append(f"the same request was made before (erasure {report.previous}): this one erases the records "
                     "not erased then")
    if report.by:
        lines.append(f"requested by {report.by} at {iso_ms(report.requested_at)}")
    lines.append(f"records: {report.matches}; blocks opened {report.blocks_opened} of {report.blocks_total}")
    for verb, rows in (("to remove" if report.dry_run else "to remove by the rewrites", report.rows_to_remove),
                       ("removed by the blocks rewritten", report.rows_removed)):
        if rows:
            lines.append(f"rows {verb}: " + ", ".join(f"{g} group {n}" for g, n in rows.items())
                         + " (one per copy of a record in a block)")
    for r in report.records:
        lines.append(f"  record {r['topic']}[{r['partition']}]@{r['offset']} time {iso_ms(r['timestamp_ms'])} "
                     f"({len(r['copies'])} backup copies)")
    for u in report.undecided:
        lines.append(f"  not erased: {u['topic']}[{u['partition']}]@{u['offset']} in block {u['block']}, at or past "
                     "the high watermark and of an incarnation the block cannot tell (--no-kafka erases it)")
    for b in report.blocks:
        what = (f"-> {b['new']}, {b['rows_removed']} rows removed" if "new" in b
                else f"level {b['level']}, {b['positions']} of its records to erase ({b['rows_to_remove']} rows)")
        lines.append(f"  block {b['id']} {b['group']} g{b['generation']} {what}")
    if report.delete_delay:
        lines.append(f"replaced blocks' objects are deleted {report.delete_delay:g} s after their rewrite "
                     "(asked for; the metastore leader never goes below its floor)")
    if report.jobs:
        lines.append(f"erase jobs waiting for the compaction workers: {len(report.jobs)}")
    for u in report.unindexed:
        lines.append(f"  not indexed yet: {lag_text(u)} (the run waits for it before it commits the request)")
    if report.dry_run:
        lines.append("run again with --yes to erase")
    return "\n".join(lines)
