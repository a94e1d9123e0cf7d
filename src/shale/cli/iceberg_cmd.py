"""``shale iceberg sync``: publish every pending change now, and (``--full``) repair tables that differ from the
index."""

from __future__ import annotations

import json

import click

from shale.cli.common import get_config, shale_errors


@click.group()
def iceberg() -> None:
    """Apache Iceberg tables over the stored blocks."""


@iceberg.command()
@click.option("--full", is_flag=True, help="Also compare every table with the index and repair differences.")
@click.pass_context
@shale_errors
def sync(ctx: click.Context, full: bool) -> None:
    """Publish pending changes as Iceberg snapshots (on the metastore leader, or on the local embedded state)."""
    config = get_config(ctx)
    if not config.iceberg.enabled:
        raise click.ClickException("iceberg.enabled is false: set it (and iceberg.catalog_uri) first")
    if config.metastore.mode == "embedded":
        from shale.iceberg import IcebergPublisher
        from shale.metastore import MetastoreService, SingleNodeLog, StateMachine, state_path
        from shale.objstore import open_bucket

        state = StateMachine(state_path(config))
        service = MetastoreService(state, SingleNodeLog(state))
        report = IcebergPublisher(config, state.reader, service.submit, open_bucket(config.bucket)).sync(full=full)
    else:
        import httpx

        from shale.metastore import client_token, tls_verify

        last = ""
        # An admin call like any other: the token, the CA, and a JSON body (the API refuses other types).
        headers = {"authorization": f"Bearer {client_token(config.metastore)}", "content-type": "application/json"}
        for address in config.metastore.addresses:
            try:
                response = httpx.post(address.rstrip("/") + "/v1/iceberg/sync", params={"full": full}, timeout=600,
                                      headers=headers, content=b"{}", verify=tls_verify(config.metastore.tls_ca_file))
            except httpx.HTTPError as exc:
                last = f"{address}: {exc}"
                continue
            if response.status_code == 200:
                report = response.json()
                break
            last = f"{address}: HTTP {response.status_code} {response.text[:200]}"
        else:
            raise click.ClickException(f"no metastore leader published the changes ({last})")
    click.echo(json.dumps(report, indent=2))
