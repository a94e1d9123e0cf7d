"""The ``shale`` command. Every command is registered here, in ``_COMMANDS`` (and ``_SUBCOMMANDS`` for a command
kept in a module of its own under a group), and imported lazily so that ``shale --help`` stays fast. Command
modules import only ``shale.cli.common`` of the CLI, never each other."""

from __future__ import annotations

import contextlib
import errno
import importlib
import logging
import os
import select
import signal
import sys
from typing import Any

import click

from shale.errors import ShaleError

# name -> (module, attribute, one-line help)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "bucket": ("shale.cli.bucket_cmd", "bucket", "Inspect and maintain blocks directly in the bucket."),
    "config": ("shale.cli.config_cmd", "config", "Check and show the configuration."),
    "dev": ("shale.cli.dev_cmd", "dev", "Start, inspect and stop the local Kafka, MinIO and Spark services."),
    "metastore": ("shale.cli.metastore_cmd", "metastore", "Run and administer the metastore."),
    "iceberg": ("shale.cli.iceberg_cmd", "iceberg", "Publish the blocks as Apache Iceberg tables."),
    "ingest": ("shale.cli.ingest_cmd", "ingest", "Persist Kafka topics into blocks, exactly once."),
    "compact": ("shale.cli.compact_cmd", "compact", "Run a compaction worker on Spark, or administer compaction."),
    "query": ("shale.cli.query_cmd", "query", "Read stored records by tenant, time range and labels."),
    "reprocess": ("shale.cli.reprocess_cmd", "reprocess", "Re-parse backup blocks into a new generation."),
    "generation": ("shale.cli.reprocess_cmd", "generation", "Switch the generation readers see."),
    "trace": ("shale.cli.reprocess_cmd", "trace", "Show where a block's records came from."),
    "locate": ("shale.cli.reprocess_cmd", "locate", "Find the blocks that hold a Kafka record."),
    "restore": ("shale.cli.restore_cmd", "restore", "Replay a topic's backup blocks into Kafka, exactly once."),
    "erase": ("shale.cli.erase_cmd", "erase", "Erase every record of one key, and prove it."),
    "tombstones": ("shale.cli.tombstones_cmd", "tombstones", "List blocks removed from the index, when and why."),
    "schemas": ("shale.cli.schemas_cmd", "schemas", "List the schema versions a tenant's blocks were written with."),
    "verify": ("shale.cli.ingest_cmd", "verify", "Reconcile Kafka offsets with the stored records."),
    "ledger": ("shale.cli.ingest_cmd", "ledger", "Show the completeness ledger of a topic."),
    "offsets": ("shale.cli.offsets_cmd", "offsets", "Show committed offsets; acknowledge offsets Kafka lost."),
    "shards": ("shale.cli.shards_cmd", "shards", "Change an ingest group's shard count while it runs."),
    "run": ("shale.cli.run_cmd", "run", "Run a whole single-machine deployment from one configuration."),
    "demo": ("shale.cli.demo_cmd", "demo", "Run the main pipeline on embedded defaults and print what it did."),
}

# group -> subcommand name -> (module, attribute): commands of a group that live in a module of their own.
_SUBCOMMANDS: dict[str, dict[str, tuple[str, str]]] = {
    "bucket": {"repair": ("shale.cli.repair_cmd", "repair")},  # the largest bucket command
}


def _load(module: str, attr: str) -> click.Command:
    command = getattr(importlib.import_module(module), attr)
    assert isinstance(command, click.Command)
    return command


GLOBAL_OPTIONS = ("--set", "--config", "--log-format")


def hoist_global_options(args: list[str]) -> list[str]:
    """The arguments with the global options written after the subcommand (``shale config check --set k=v``) moved
    before it, where click looks for them; nothing after ``--`` moves."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg in GLOBAL_OPTIONS and i + 1 < len(args):
            front += args[i:i + 2]
            i += 2
            continue
        if arg.startswith(tuple(f"{name}=" for name in GLOBAL_OPTIONS)):
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test's captured output)
        return False


def _closed_pipe() -> None:
    """The reader of our output went away (``shale query ... | head``): end as Unix tools do, quietly, by SIGPIPE
    (exit status 141 in a shell), without flushing buffers into the closed pipe or running native teardown."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    os._exit(128 + signal.SIGPIPE)  # pragma: no cover - only where SIGPIPE cannot be delivered


class LazyGroup(click.Group):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_global_options(args))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here, not at exit
        except OSError as exc:  # BrokenPipeError; pyarrow's writers report EPIPE as a plain OSError
            broken = isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE or "Broken pipe" in str(exc)
            if not (broken and _stdout_closed()):
                raise  # a socket's EPIPE (a connection to a service) is an error to report, not a quiet end
            _closed_pipe()
        return result

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        module, attr, _ = _COMMANDS[cmd_name]
        command = _load(module, attr)
        for name, (sub_module, sub_attr) in _SUBCOMMANDS.get(cmd_name, {}).items():
            assert isinstance(command, click.Group)
            command.add_command(_load(sub_module, sub_attr), name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="SHALE_CONFIG",
              help="TOML config file (default: ./shale.toml if present, else embedded defaults).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override one setting, e.g. --set bucket.url=memory://x (repeatable).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None, help="Log line format.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, overrides: tuple[str, ...], log_format: str | None) -> None:
    """Shale keeps Kafka topics in object storage as immutable, queryable blocks, exactly once."""
    ctx.obj = {"config_path": config_path, "overrides": list(overrides), "log_format": log_format}


QUICK_EXIT = frozenset({"query"})
"""Commands that end with ``os._exit`` once their output and logs are flushed, skipping native teardown. A filtered
read can release its source on an Arrow pool thread after it returned; over Python memory that release takes the
GIL, which at interpreter exit ends the thread inside a C++ destructor ("terminate called without an active
exception", exit 134 after a complete answer). ``block.reader.arrow_owned`` removes the cause for whole-object
reads; a ranged read of a large object still hands Arrow a Python file. A query writes nothing that teardown would
finish (its output files are closed before it returns) and starts no Spark (docs/DESIGN.md §13)."""


def _command_name(args: list[str]) -> str | None:
    i = 0
    while i < len(args):
        if args[i] in GLOBAL_OPTIONS:
            i += 2
        elif args[i].startswith("-"):
            i += 1
        else:
            return args[i]
    return None


def main(argv: list[str] | None = None) -> Any:
    """The ``shale`` command (console script and ``python -m shale.cli``)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        return cli.main(args=argv, prog_name="shale", standalone_mode=True)
    except ShaleError as exc:  # pragma: no cover - click's standalone mode handles most exits
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except SystemExit as done:
        if _command_name(args) not in QUICK_EXIT:
            raise
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        if isinstance(done.code, str):
            click.echo(done.code, err=True)
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
