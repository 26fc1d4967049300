"""The `pystatestore` commands that write a new checkpoint from an old one: migrate (another
provider) and repartition (another partition count). The work is in rewrite.py and the modules
beside it; these print the plan, run it with progress bars and say what was written.
"""

from __future__ import annotations

from typing import Any

import click

from ..store.errors import StateStoreError
from .cli_output import out, progress_bars


def _rewrite(command: str, checkpoint: str, output: str, dry_run: bool, master: str, **target: Any) -> None:
    # Imported here, when a rewrite runs: the read-only commands start without them.
    from .rewrite_plan import plan_rewrite

    try:
        plan = plan_rewrite(command, checkpoint, output, **target)
    except StateStoreError as e:
        raise click.ClickException(str(e)) from None
    from .rewrite import rewrite, runs_without_spark
    from .rewrite_spark import rewrite_session

    direct = runs_without_spark(plan)
    for line in plan.describe():
        out.print(line, highlight=False)
    out.print(
        "  runs without Spark: both ends are pystatestore's files"
        if direct
        else f"  runs in a local Spark session ({master})",
        highlight=False,
    )
    if dry_run:
        return
    spark = None if direct else rewrite_session(command, master)
    try:
        with progress_bars(True) as progress:
            results = rewrite(plan, spark, progress)
    except StateStoreError as e:
        raise click.ClickException(str(e)) from None
    finally:
        if spark is not None:
            spark.stop()
    for r in results:
        out.print(
            f"  {r.kind.label}: {r.rows:,} keys in {r.partitions} partitions ({r.seconds:.1f} s)", highlight=False
        )
    out.print(
        f"wrote {plan.output}: batch {plan.write_batch}, state version {plan.state_version}, read back and compared; "
        "restart the query on it",
        highlight=False,
    )


@click.command()
@click.argument("checkpoint")
@click.option("--to", "to", type=click.Choice(["pystatestore", "hdfs", "rocksdb"]), required=True, help="The provider.")
@click.option("-o", "--output", required=True, help="The new checkpoint directory (must not exist).")
@click.option("--dry-run", is_flag=True, help="Print the plan only.")
@click.option("--master", default="local[*]", show_default=True, help="The Spark master the rewrite runs on.")
def migrate(checkpoint: str, to: str, output: str, dry_run: bool, master: str) -> None:
    """The state of the last committed batch, written for another provider as a new checkpoint.

    The source is only read. Spark refuses the new checkpoint until the command has finished; it
    then holds one more batch, which reads no input: restart the query on it."""
    _rewrite("migrate", checkpoint, output, dry_run, master, to=to)


@click.command()
@click.argument("checkpoint")
@click.option("--partitions", type=click.IntRange(min=1), required=True, help="The new partition count.")
@click.option("-o", "--output", required=True, help="The new checkpoint directory (must not exist).")
@click.option("--dry-run", is_flag=True, help="Print the plan only.")
@click.option("--master", default="local[*]", show_default=True, help="The Spark master the rewrite runs on.")
def repartition(checkpoint: str, partitions: int, output: str, dry_run: bool, master: str) -> None:
    """The state of the last committed batch, placed for another partition count as a new checkpoint.

    Keys go where Spark's hash partitioning puts them for the new count. The source is only read;
    Spark refuses the new checkpoint until the command has finished: restart the query on it."""
    _rewrite("repartition", checkpoint, output, dry_run, master, partitions=partitions)
