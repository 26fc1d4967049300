"""The `pystatestore` commands that only read a checkpoint: inspect, verify, gc --dry-run, du, read
and report. Everything they show comes from inspection.py, verification.py, state_rows.py and
report.py, which scripts can call directly.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ..reading.checkpoint import StoreLocation
from ..reading.decoded import json_value, python_rows
from ..reading.families import FamilyCount
from ..reading.unsafe_row import unique_names
from ..store.errors import StateStoreError
from ..store.leases import DEFAULT_ORPHAN_GRACE_SECONDS
from .cli_output import err, open_or_fail, out, progress_bars, size_text, utc_text
from .inspection import KINDS, disk_usage, has_families, inspect_checkpoint, store_families, tree_as_json
from .state_rows import read_state
from .verification import gc_dry_run, verify_checkpoint


def _grace_seconds_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--grace-seconds as verify and gc take it; `help_text` says what it is to each."""
    return click.option(
        "--grace-seconds", type=float, default=DEFAULT_ORPHAN_GRACE_SECONDS, show_default=True, help=help_text
    )


@click.command()
@click.argument("checkpoint")
@click.option("--batch", type=int, default=None, help="A committed batch (default: the last).")
@click.option("--json", "as_json", is_flag=True, help="Print the metadata tree as JSON.")
@click.option(
    "--families",
    "count_families",
    is_flag=True,
    help="transformWithState stores: keys, values and bytes per column family (state variable); reads the state.",
)
def inspect(checkpoint: str, batch: int | None, as_json: bool, count_families: bool) -> None:
    """The checkpoint as a metadata tree: batch → operator → partition → store → manifest."""
    ckpt = open_or_fail(checkpoint)
    try:
        with progress_bars(not as_json) as progress:
            version, nodes = inspect_checkpoint(ckpt, batch, progress)
            families = store_families(nodes, progress) if count_families else None
    except StateStoreError as e:
        raise click.ClickException(str(e)) from None
    shown_batch = version - 1
    if as_json:
        click.echo(json.dumps(tree_as_json(ckpt, shown_batch, version, nodes, families), indent=2))
        return
    out.print(f"[bold]{ckpt.uri}[/bold]")
    out.print(
        f"query {ckpt.query_id}, provider {ckpt.provider or 'unknown'}, batches committed "
        f"{ckpt.committed_span}; batch {shown_batch} is state version {version}"
    )
    table = Table(show_lines=False)
    for col in ("op", "part", "store", "kind", "keys", "files", "reused", "new", "changes", "chain"):
        table.add_column(col, justify="left" if col in ("store", "kind") else "right", overflow="fold")
    for n in nodes:
        s, loc = n.summary, n.location
        if s is None:
            table.add_row(str(loc.operator_id), str(loc.partition_id), loc.store_name, "[red]problem[/red]")
            continue
        changes = "-"
        if s.kind == "changelog":
            inline = " inline" if s.changelog_inline else ""
            changes = f"{s.changelog_rows} rows, {size_text(s.changelog_bytes)}{inline}"
        table.add_row(
            str(loc.operator_id),
            str(loc.partition_id),
            loc.store_name,
            s.kind,
            f"{s.num_keys:,}",
            f"{s.shared_files + s.private_files} + {s.inline_files} inline",
            size_text(s.reused_bytes),
            size_text(s.new_bytes + s.private_bytes),
            changes,
            str(s.chain_length),
        )
    out.print(table)
    for n in nodes:
        if n.problem:
            out.print(f"[red]problem[/red] {n.location.label}: {n.problem}", soft_wrap=True)
    written = [n.summary.created_at for n in nodes if n.summary]
    if written:
        out.print(f"written {utc_text(min(written))} .. {utc_text(max(written))}; --json for writers, ids and sizes")
    if families is not None:
        _print_families(families)
    elif any(has_families(n) for n in nodes):
        out.print("stores with column families (transformWithState): --families counts each state variable's keys")


def _print_families(families: dict[StoreLocation, list[FamilyCount] | str]) -> None:
    table = Table(title="column families (state variables; names starting with $ are Spark's timers and TTL indexes)")
    for col in ("op", "part", "store", "family", "id", "encoding", "keys", "values", "bytes"):
        table.add_column(col, justify="left" if col in ("store", "family", "encoding") else "right", overflow="fold")
    for loc, counts in families.items():
        if isinstance(counts, str):
            table.add_row(str(loc.operator_id), str(loc.partition_id), loc.store_name, "[red]problem[/red]")
            out.print(f"[red]problem[/red] {loc.label}: {counts}", soft_wrap=True)
            continue
        for c in counts:
            encoding = c.family.key_encoding + (", several values" if c.family.multiple_values else "")
            table.add_row(
                str(loc.operator_id),
                str(loc.partition_id),
                loc.store_name,
                c.family.name,
                str(c.family.family_id),
                encoding,
                f"{c.keys:,}",
                f"{c.values:,}",
                size_text(c.key_bytes + c.value_bytes),
            )
    out.print(table)


@click.command()
@click.argument("checkpoint")
@click.option(
    "--deep",
    is_flag=True,
    help="Also read every file and every payload stored inside a manifest or snapshot, and compare its checksum.",
)
@_grace_seconds_option("Unreferenced files younger than this may belong to a commit in progress.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(checkpoint: str, deep: bool, grace_seconds: float, as_json: bool) -> None:
    """Check that every retained version can be restored: its changelog chain back to a snapshot,
    and every file it needs, present with its size (--deep: and its checksum, data stored inside
    manifests and snapshots included). Exit status 0 only when no problem was found."""
    ckpt = open_or_fail(checkpoint)
    with progress_bars(not as_json) as progress:
        report = verify_checkpoint(ckpt, deep=deep, grace_seconds=grace_seconds, progress=progress)
    if as_json:
        doc = {
            "checkpoint": ckpt.uri,
            "restorable": report.restorable,
            "stores": report.stores,
            "manifests": report.manifests,
            "files": report.files,
            "bytes_checksummed": report.bytes_checked,
            "problems": [p.__dict__ for p in report.problems],
            "unreferenced": report.unreferenced,
            "unreferenced_young": report.young_unreferenced,
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        for p in report.problems:
            out.print(f"[red]PROBLEM[/red] {p}", soft_wrap=True)
        for f in report.unreferenced:
            out.print(f"[yellow]unreferenced[/yellow] {f} (maintenance deletes it)", soft_wrap=True)
        for f in report.young_unreferenced:
            out.print(f"unreferenced, recent {f} (a commit in progress?)", soft_wrap=True)
        checked = f"{report.stores} stores, {report.manifests} manifests, {report.files} files"
        checked += f" ({size_text(report.bytes_checked)} checksummed)" if deep else " (sizes; --deep for checksums)"
        if report.restorable:
            out.print(f"[green]OK[/green]: {checked}; the checkpoint can be restored")
        else:
            out.print(f"[red]FAILED[/red]: {len(report.problems)} problems in {checked}")
    sys.exit(0 if report.restorable else 1)


@click.command()
@click.argument("checkpoint")
@click.option("--dry-run", is_flag=True, required=True, help="List what maintenance would delete (required).")
@click.option(
    "--min-batches-to-retain",
    type=int,
    default=100,
    show_default=True,
    help="The query's spark.sql.streaming.minBatchesToRetain.",
)
@_grace_seconds_option("The query's spark.sql.streaming.stateStore.pystatestore.orphanGraceSeconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def gc(checkpoint: str, dry_run: bool, min_batches_to_retain: int, grace_seconds: float, as_json: bool) -> None:
    """What the next maintenance run would delete, and why. Deletes nothing: the running query's
    maintenance does that."""
    ckpt = open_or_fail(checkpoint)
    try:
        with progress_bars(not as_json) as progress:
            doomed = gc_dry_run(
                ckpt, min_batches_to_retain=min_batches_to_retain, grace_seconds=grace_seconds, progress=progress
            )
    except StateStoreError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps([d.__dict__ for d in doomed], indent=2))
        return
    for d in doomed:
        out.print(f"{d.store}/{d.path} ({size_text(d.size)}): {d.reason}", soft_wrap=True)
    out.print(f"maintenance would delete {len(doomed)} files, {size_text(sum(d.size for d in doomed))}")


@click.command()
@click.argument("checkpoint")
@click.option("--json", "as_json", is_flag=True, help="Print the usage as JSON.")
def du(checkpoint: str, as_json: bool) -> None:
    """Bytes and files by operator, partition, store and kind."""
    ckpt = open_or_fail(checkpoint)
    with progress_bars(not as_json) as progress:
        usage = disk_usage(ckpt, progress)
    if as_json:
        click.echo(json.dumps([{**u.__dict__, "total_bytes": u.total_bytes} for u in usage], indent=2))
        return
    table = Table()
    for col in ("op", "part", "store", *KINDS, "total"):
        table.add_column(col, justify="left" if col == "store" else "right")
    totals = dict.fromkeys(KINDS, 0)
    for u in usage:
        for k in KINDS:
            totals[k] += u.bytes[k]
        table.add_row(
            str(u.operator_id),
            str(u.partition_id),
            u.store_name,
            *(f"{size_text(u.bytes[k])} / {u.files[k]}" if u.files[k] else "-" for k in KINDS),
            size_text(u.total_bytes),
        )
    table.add_row("", "", "[bold]all[/bold]", *(size_text(totals[k]) for k in KINDS), size_text(sum(totals.values())))
    out.print(table)
    out.print("cells: bytes / files")


@click.command()
@click.argument("checkpoint")
@click.option("--operator", type=int, default=0, show_default=True)
@click.option("--store-name", default="default", show_default=True, help="Joins: left-keyToNumValues, ...")
@click.option("--batch", type=int, default=None, help="A committed batch (default: the last).")
@click.option("--partition", "partitions", type=int, multiple=True, help="Only these partitions (repeatable).")
@click.option(
    "--key",
    "keys",
    multiple=True,
    help="Only the row with this key, as JSON (as `-o -` prints keys): --key '{\"id\": 7}'. A key naming every "
    "key column is looked up in its partition alone; one naming some columns is scanned for.",
)
@click.option(
    "--family",
    default=None,
    help="transformWithState: the state variable (column family) to read; a list's values one row each.",
)
@click.option("-o", "--output", required=True, help="out.parquet, out.csv, or - for JSON lines on stdout.")
def read(
    checkpoint: str,
    operator: int,
    store_name: str,
    family: str | None,
    batch: int | None,
    partitions: tuple[int, ...],
    keys: tuple[str, ...],
    output: str,
) -> None:
    """The state rows of a committed batch, decoded from Spark's UnsafeRow format."""
    ckpt = open_or_fail(checkpoint)
    try:
        wanted = [json.loads(k) for k in keys] or None
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--key") from None
    if wanted is not None and not all(isinstance(k, dict) for k in wanted):
        raise click.BadParameter('a key is a JSON object of key fields, e.g. {"id": 7}', param_hint="--key")
    try:
        with progress_bars(output != "-") as progress:
            table = read_state(
                ckpt,
                operator=operator,
                store_name=store_name,
                batch=batch,
                partitions=partitions or None,
                keys=wanted,
                family=family,
                progress=progress,
                notice=lambda message: err.print(message, markup=False),
            )
    except StateStoreError as e:
        raise click.ClickException(str(e)) from None
    if output == "-":
        for row in python_rows(table):
            click.echo(json.dumps(row, default=json_value))
        return
    path = Path(output)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif path.suffix == ".csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(_flat_for_csv(table), path)
    else:
        raise click.BadParameter("write .parquet, .csv, or - (JSON lines on stdout)", param_hint="--output")
    err.print(f"{table.num_rows} rows written to {path}")


@click.command()
@click.argument("checkpoint")
@click.option("-o", "--output", required=True, help="The HTML file to write.")
@click.option("--deep", is_flag=True, help="Verify checksums too.")
def report(checkpoint: str, output: str, deep: bool) -> None:
    """One self-contained HTML file: sizes, uploads, commit times and skew per version, and the
    verify summary. Works offline (nothing is loaded from the network)."""
    from .report import write_report

    ckpt = open_or_fail(checkpoint)
    with progress_bars(True) as progress:
        verify_report = write_report(ckpt, Path(output), deep=deep, progress=progress)
    state = "restorable" if verify_report.restorable else f"NOT restorable ({len(verify_report.problems)} problems)"
    err.print(f"report written to {output}; the checkpoint is {state}")


def _flat_for_csv(table: Any) -> Any:
    """Struct columns become key.a, key.b, ... (repeated names numbered, as `read -o -` shows them);
    lists and maps become JSON text (CSV has no nesting)."""
    import pyarrow as pa

    def unique(arr: pa.Array) -> pa.Array:
        if not pa.types.is_struct(arr.type):
            return arr
        children = [unique(arr.field(i)) for i in range(arr.type.num_fields)]
        names = unique_names([f.name for f in arr.type])
        return pa.StructArray.from_arrays(children, names=names, mask=arr.is_null())

    table = pa.table({n: unique(c.combine_chunks()) for n, c in zip(table.column_names, table.columns, strict=True)})
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    columns = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        t = col.type
        if pa.types.is_list(t) or pa.types.is_map(t) or pa.types.is_large_list(t):
            col = pa.array([None if v is None else json.dumps(v, default=json_value) for v in col.to_pylist()])
        columns[name] = col
    return pa.table(columns)
