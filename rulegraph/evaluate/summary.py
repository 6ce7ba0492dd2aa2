"""An evaluation's results: per method and metric the mean with its bootstrap interval, the mean
curves and the throughput (:class:`Summary`, from the journal's rows by :func:`aggregate`),
and what an evaluation writes (:func:`write`): ``table.csv``, ``summary.json``, the plots.
The terminal table is drawn by the command line, the Markdown one here."""
from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..audit import LITTLE
from ..files import write_file
from . import metrics as M, paired
from .bootstrap import BOOTSTRAP, bootstrap

TIMING = ("explained/min and evaluated/min exclude one warm-up call per method (and one forward of the "
          "metrics' model), made before the timed calls")


@dataclass
class Summary:
    table: dict[str, dict[str, dict[str, float]]]       # method → metric → {mean, low, high, n}
    curves: dict[str, dict[str, list[float]]]            # metric → method → mean curve
    throughput: dict[str, dict[str, float]]
    n_examples: int
    rows: list[dict]
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)   # method → {texts, of, error, examples}
    scores: dict[str, str] = field(default_factory=dict)    # method → the quantity its scores are
    skipped: int = 0                # texts under the protocol's minimum length, not evaluated
    protocol: str = ""              # the resolved protocol in one line
    paired: dict[str, dict[str, Any]] = field(default_factory=dict)   # "A − B" → metric → paired.Difference


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {cores} cores, {platform.system()} {platform.release()}, torch {torch.__version__}"


def failures(rows: list[dict], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method that failed on some texts: how many (``texts`` of ``of``) and the first error."""
    out = {}
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        bad = [r for r in mine if "error" in r]
        if bad:
            out[method] = {"texts": len(bad), "of": len(mine), "error": bad[0]["error"],
                           "examples": [r["example"] for r in bad]}
    return out


def aggregate(rows: list[dict], methods: list[str], metrics: list[M.Metric], seed: int, n_examples: int) -> Summary:
    table: dict[str, dict[str, dict[str, float]]] = {}
    curves: dict[str, dict[str, list[float]]] = {}
    throughput: dict[str, dict[str, float]] = {}
    for method in methods:
        mine = [r for r in rows if r["method"] == method and "error" not in r]
        if not mine:
            continue
        table[method] = {}
        for metric in metrics:
            values = [r["metrics"].get(metric.name) for r in mine]
            values = [v for v in values if v is not None]
            if not values:
                continue
            mean, low, high = bootstrap(values, seed)
            table[method][metric.name] = {"mean": mean, "low": low, "high": high, "n": len(values)}
            series = [r["curves"][metric.name] for r in mine if metric.name in r.get("curves", {})]
            if series:
                curves.setdefault(metric.name, {})[method] = np.mean(np.asarray(series, dtype=np.float64), 0).tolist()
        explain = sum(r["explain_seconds"] for r in mine)
        total = explain + sum(r["metric_seconds"] for r in mine)
        throughput[method] = {
            "examples": len(mine), "mean_tokens": float(np.mean([r["tokens"] for r in mine])),
            "explain_seconds": explain, "metric_seconds": total - explain,
            "explain_per_minute": 60 * len(mine) / explain if explain else float("inf"),
            "evaluated_per_minute": 60 * len(mine) / total if total else float("inf"),
        }
    return Summary(table, curves, throughput, n_examples, rows)


def conservation(summary: Summary, additive: dict[str, bool]) -> dict[str, dict[str, float]]:
    """Per additive method: the median of :func:`~rulegraph.evaluate.plots.token_shares`, how many items, and how many
    whose tokens carry under half of the explained value or the opposite sign."""
    from .plots import token_shares
    out = {}
    for method in summary.table:
        shares = token_shares(summary.rows, method) if additive.get(method) else []
        if shares:
            out[method] = {"median_token_share": shares[len(shares) // 2], "n": len(shares),
                           "under_half": sum(x < LITTLE for x in shares)}
    return out


def table_rows(summary: Summary, metrics: list[M.Metric], cell, bold):
    """(shown metrics, [(method, cells)]): each cell ``cell(stats)``, the best mean per metric
    passed through ``bold``, ``–`` where a method has no figure."""
    shown = [m for m in metrics if any(m.name in per for per in summary.table.values())]
    best = {}
    for m in shown:
        means = {k: per[m.name]["mean"] for k, per in summary.table.items() if m.name in per}
        best[m.name] = (max if m.higher_is_better else min)(means, key=means.get)
    rows = [(method, ["–" if m.name not in per else bold(cell(per[m.name])) if best[m.name] == method
                      else cell(per[m.name]) for m in shown])
            for method, per in summary.table.items()]
    return shown, rows


def header(m: M.Metric) -> str:
    """A metric's column head: its name and direction."""
    return f"{m.name} {m.direction()}"


def markdown_table(summary: Summary, metrics: list[M.Metric]) -> str:
    """The same table in Markdown (for docs)."""
    shown, rows = table_rows(summary, metrics, lambda s: f"{s['mean']:.3f} [{s['low']:.3f}, {s['high']:.3f}]",
                        lambda text: f"**{text}**")
    lines = ["| method | " + " | ".join(map(header, shown)) + " |", "|" + "---|" * (len(shown) + 1)]
    lines += [f"| {method} | " + " | ".join(cells) + " |" for method, cells in rows]
    return "\n".join(lines)


def parquet_row(row: dict) -> dict:
    """A results row with its metrics and curves as columns (``metric.<name>``, ``curve.<name>``)."""
    flat = {k: v for k, v in row.items() if k not in ("metrics", "curves")}
    flat.setdefault("error", None)
    flat.update({f"metric.{k}": v for k, v in row.get("metrics", {}).items()})
    flat.update({f"curve.{k}": v for k, v in row.get("curves", {}).items()})
    return flat


def write(out: Path, summary: Summary, metrics: list[M.Metric], context: dict[str, Any], methods: dict[str, Any]) -> None:
    """``table.csv``, ``summary.json`` (``context``: the settings and protocol, after the date and
    machine), ``curves.png`` and ``conservation.png`` of an evaluation in ``out``; ``methods``: name →
    :class:`~rulegraph.methods.Method` (what the plots draw dashed, or in the conservation scatter)."""
    from . import plots
    lines = ["method,metric,mean,ci_low,ci_high,n"]
    for method, per in summary.table.items():
        for metric, s in per.items():
            lines.append(f"{method},{metric},{s['mean']:.6g},{s['low']:.6g},{s['high']:.6g},{s['n']}")
    write_file(out / "table.csv", "\n".join(lines) + "\n", "table.csv")
    doc = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        **context,
        "n_examples": summary.n_examples,
        "table": summary.table,
        "higher_is_better": {m.name: m.higher_is_better for m in metrics},
        "curves": summary.curves,
        "curve_x": {m.name: m.xs() for m in metrics if m.xs()},
        "throughput": summary.throughput,
        "timing": TIMING,
        "scores": summary.scores,
        "failed": summary.failed,
        "conservation": conservation(summary, {n: m.additive for n, m in methods.items()}),
    }
    if summary.paired:
        doc["paired"] = paired.as_json(summary.paired)
        doc["paired_caption"] = paired.CAPTION
        write_file(out / "paired.csv", paired.csv_text(summary.paired), "paired.csv")
    else:
        (out / "paired.csv").unlink(missing_ok=True)
    write_file(out / "summary.json", json.dumps(doc, indent=2) + "\n", "summary.json")
    plots.curves(summary, metrics, out / "curves.png", {n: m.reference for n, m in methods.items()})
    plots.conservation(summary, {n: m.additive for n, m in methods.items()}, out / "conservation.png")
