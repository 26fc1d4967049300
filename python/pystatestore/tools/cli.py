"""The `pystatestore` command: look inside a streaming checkpoint without Spark or a JVM.

    pystatestore inspect CHECKPOINT [--batch N] [--families] [--json]
    pystatestore verify CHECKPOINT [--deep] [--json]
    pystatestore gc CHECKPOINT --dry-run [--min-batches-to-retain 100] [--grace-seconds 600] [--json]
    pystatestore du CHECKPOINT [--json]
    pystatestore read CHECKPOINT [--operator N] [--store-name S] [--family F] [--batch N] [--key JSON]
                      -o out.parquet|out.csv|-
    pystatestore report CHECKPOINT -o report.html [--deep]
    pystatestore serve CHECKPOINT [--host 127.0.0.1] [--port 8765] [--token-file FILE]
    pystatestore migrate CHECKPOINT --to pystatestore|hdfs|rocksdb -o NEW [--dry-run] [--master M]
    pystatestore repartition CHECKPOINT --partitions N -o NEW [--dry-run] [--master M]

click parses the command line and rich draws tables and progress bars (plain text when the output
is not a terminal, and no colours then or under NO_COLOR); `--json` prints machine-readable output.
This module holds the command group (the console script's entry point); the commands that only
read are in cli_read_only.py, migrate and repartition in cli_rewrite.py, serve in cli_serve.py,
what they share in cli_output.py. Everything shown comes from inspection.py, verification.py,
state_rows.py, rewrite.py and query/ (StateClient), which scripts can call directly.
"""

from __future__ import annotations

import click

from ..release import __version__
from .cli_read_only import du, gc, inspect, read, report, verify
from .cli_rewrite import migrate, repartition
from .cli_serve import serve


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pystatestore")
def main() -> None:
    """Look inside a Spark streaming checkpoint written with pystatestore, without Spark or a JVM."""


for command in (inspect, verify, gc, du, read, report, migrate, repartition, serve):
    main.add_command(command)


if __name__ == "__main__":
    main()
