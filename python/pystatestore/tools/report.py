"""`pystatestore report`: one self-contained HTML file about a checkpoint (plots and the verify
summary), for opening offline: plotly draws the plots, and its JavaScript is embedded once in
the page, so nothing is fetched from a CDN.

Plots: the checkpoint bytes and files each version needs to be restored, bytes uploaded vs
reused per commit, the commit time split (from the step times manifests record), and per-partition
skew of the latest version; for transformWithState stores, the keys and bytes of each column family
(state variable) at the last batch.
"""

from __future__ import annotations

import datetime as dt
import html
import statistics
from collections import defaultdict
from pathlib import Path

from ..reading.checkpoint import SparkCheckpoint
from .inspection import Progress, StoreVersion, checkpoint_history, has_families, inspect_checkpoint, store_families
from .verification import VerifyReport, verify_checkpoint

MIB = 1024 * 1024
STEP_LABELS = {
    "restoreMs": "restore base",
    "segmentMs": "changelog segment (durable first)",
    "applyMs": "apply changes",
    "flushMs": "ingest",
    "checkpointMs": "RocksDB checkpoint",
    "uploadMs": "upload",
}


def _no_progress(what: str, done: int, total: int) -> None:
    pass


def build_report(
    ckpt: SparkCheckpoint, *, deep: bool = False, progress: Progress = _no_progress
) -> tuple[str, VerifyReport]:
    """The report's HTML and the verify report it summarises."""
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.subplots import make_subplots

    history = checkpoint_history(ckpt, progress)
    verify = verify_checkpoint(ckpt, deep=deep, progress=progress)
    families = _families_table(ckpt, progress)
    by_version: dict[int, list[StoreVersion]] = defaultdict(list)
    for sv in history:
        by_version[sv.summary.version].append(sv)
    versions = sorted(by_version)
    figures = []

    size = make_subplots(specs=[[{"secondary_y": True}]])
    size.add_bar(x=versions, y=[sum(s.restore_bytes for s in by_version[v]) / MIB for v in versions], name="MiB")
    size.add_scatter(
        x=versions,
        y=[sum(s.restore_files for s in by_version[v]) for v in versions],
        name="files",
        mode="lines+markers",
        secondary_y=True,
    )
    size.update_layout(title="What restoring each version reads (all stores)", xaxis_title="version (batch + 1)")
    size.update_yaxes(title_text="MiB", secondary_y=False)
    size.update_yaxes(title_text="files", secondary_y=True)
    figures.append(size)

    uploads = go.Figure()
    uploads.add_bar(
        x=versions, y=[sum(s.summary.uploaded_bytes for s in by_version[v]) / MIB for v in versions], name="uploaded"
    )
    uploads.add_bar(
        x=versions, y=[sum(s.summary.reused_bytes for s in by_version[v]) / MIB for v in versions], name="reused"
    )
    uploads.update_layout(
        barmode="stack",
        title="Bytes uploaded vs reused per commit (all stores)",
        xaxis_title="version",
        yaxis_title="MiB",
    )
    figures.append(uploads)

    timed = [v for v in versions if any(s.summary.commit_ms for s in by_version[v])]
    times = go.Figure()
    for step, label in STEP_LABELS.items():
        times.add_bar(
            x=timed,
            y=[statistics.mean(s.summary.commit_ms.get(step, 0) for s in by_version[v]) for v in timed],
            name=label,
        )
    times.update_layout(
        barmode="stack", title="Commit time split (mean over stores)", xaxis_title="version", yaxis_title="ms"
    )
    figures.append(times)

    latest = versions[-1] if versions else None
    skew = make_subplots(specs=[[{"secondary_y": True}]])
    if latest is not None:
        per_partition: dict[int, list[StoreVersion]] = defaultdict(list)
        for s in by_version[latest]:
            per_partition[s.location.partition_id].append(s)
        parts = sorted(per_partition)
        skew.add_bar(x=parts, y=[sum(s.summary.num_keys for s in per_partition[p]) for p in parts], name="keys")
        skew.add_scatter(
            x=parts,
            y=[sum(s.restore_bytes for s in per_partition[p]) / MIB for p in parts],
            name="MiB",
            mode="markers",
            secondary_y=True,
        )
    skew.update_layout(title=f"Per-partition skew, version {latest}", xaxis_title="partition")
    skew.update_yaxes(title_text="keys", secondary_y=False)
    skew.update_yaxes(title_text="MiB", secondary_y=True)
    for fig in (size, skew):
        fig.update_yaxes(rangemode="tozero")  # a skew is only visible against zero
    figures.append(skew)

    plots = [
        pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False})
        for i, fig in enumerate(figures)
    ]
    return _page(ckpt, verify, history, plots, families, deep=deep), verify


def _families_table(ckpt: SparkCheckpoint, progress: Progress) -> str:
    """An HTML table of each column family's keys, values and bytes, summed over partitions, at the
    last batch; empty when no store has column families."""
    if not ckpt.committed_batches:
        return ""
    version, nodes = inspect_checkpoint(ckpt, progress=progress)
    if not any(has_families(n) for n in nodes):
        return ""
    totals: dict[tuple[int, str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    problems = []
    for loc, counts in store_families(nodes, progress).items():
        if isinstance(counts, str):
            problems.append(f"{loc.label}: {counts}")
            continue
        for c in counts:
            t = totals[(loc.operator_id, loc.store_name, c.family.name)]
            t[0] += c.keys
            t[1] += c.values
            t[2] += c.key_bytes + c.value_bytes
            t[3] += 1 if c.keys else 0
    e = html.escape
    rows = "".join(
        f"<tr><td>{op}</td><td>{e(store)}</td><td>{e(name)}</td><td>{keys:,}</td><td>{values:,}</td>"
        f"<td>{size / 1024:,.1f}</td><td>{parts}</td></tr>"
        for (op, store, name), (keys, values, size, parts) in sorted(totals.items())
    )
    unread = "".join(f"<li>{e(p)}</li>" for p in problems)
    return f"""<h2>State variables (column families), batch {version - 1}</h2>
<p>Names starting with $ are Spark's own families: timers, TTL indexes, list row counters.</p>
<table><tr><th>op</th><th>store</th><th>family</th><th>keys</th><th>values</th><th>KiB</th>
<th>partitions holding keys</th></tr>{rows}</table>{f"<ul>{unread}</ul>" if unread else ""}
"""


def _page(
    ckpt: SparkCheckpoint,
    verify: VerifyReport,
    history: list[StoreVersion],
    plots: list[str],
    families: str,
    *,
    deep: bool,
) -> str:
    e = html.escape
    status = "restorable" if verify.restorable else f"NOT restorable: {len(verify.problems)} problems"
    problems = "".join(f"<li>{e(str(p))}</li>" for p in verify.problems) or "<li>none</li>"
    unreferenced = "".join(f"<li>{e(f)}</li>" for f in verify.unreferenced[:200]) or "<li>none</li>"
    stores = len({(s.location.operator_id, s.location.partition_id, s.location.store_name) for s in history})
    made = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>pystatestore report: {e(ckpt.uri)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
.ok {{ color: #176f2c; }} .bad {{ color: #b00020; }}
code {{ background: #f4f4f4; padding: 0 .2em; }}
td, th {{ padding: 0 .6em; text-align: right; }}
</style></head><body>
<h1>Checkpoint report</h1>
<p><code>{e(ckpt.uri)}</code><br>query {e(str(ckpt.query_id))}, provider {e(str(ckpt.provider))},
batches committed {e(ckpt.committed_span)}, {stores} stores; made {made}</p>
<h2>Verify</h2>
<p class="{"ok" if verify.restorable else "bad"}">{e(status)}: {verify.stores} stores, {verify.manifests}
manifests, {verify.files} files checked ({"sizes and checksums" if deep else "sizes"}).</p>
<h3>Problems</h3><ul>{problems}</ul>
<h3>Unreferenced files (maintenance deletes them)</h3><ul>{unreferenced}</ul>
{families}<h2>History</h2>
{"".join(f'<div class="plot">{p}</div>' for p in plots)}
</body></html>
"""


def write_report(
    ckpt: SparkCheckpoint, output: Path, *, deep: bool = False, progress: Progress = _no_progress
) -> VerifyReport:
    page, verify = build_report(ckpt, deep=deep, progress=progress)
    output.write_text(page, encoding="utf-8")
    return verify
