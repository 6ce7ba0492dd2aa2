"""Paired differences between methods on the same texts.

Each method's table cell is its mean with its own bootstrap interval; two methods whose intervals
overlap can still differ reliably, since every text is scored by both. A paired difference takes,
per text, method A's metric minus method B's, over the texts both scored (a failed row, or a metric
undefined on a text, leaves that text out of that column), and reports the mean with its 95%
percentile-bootstrap interval (:func:`rulegraph.evaluate.bootstrap.bootstrap`, the evaluation's seed),
the differences taken in the order of the texts (so every engine gives the same interval).

``rulegraph evaluate … --paired A-B,C-D`` adds these to a run (``paired.csv``, ``summary.json``);
``rulegraph compare RESULTS… --paired A-B`` computes them from results already written (folders
holding ``results.jsonl``, or ``results.jsonl[.gz]`` files; several runs over the same texts, e.g.
two method sets of one part, are read together).
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import InputError, choices
from . import metrics as M
from .bootstrap import bootstrap

RESULTS = "results.jsonl"


@dataclass(frozen=True)
class Difference:
    """A − B on one metric: mean, 95% interval, and the number of texts both scored."""

    mean: float
    low: float
    high: float
    n: int


def parse_pairs(spec: str | Sequence[str], methods: Sequence[str]) -> list[tuple[str, str]]:
    """``"A-B,C-D"`` (or a list of ``"A-B"``) → [(A, B), (C, D)]. Method names contain ``-`` themselves
    (``lrp-ah-ln``), so each item is cut at the one ``-`` that leaves two of ``methods``; none, or more
    than one, is an error naming the methods. A ``LABEL=METHOD`` method may be named by its label."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not items:
        raise InputError("--paired is empty; give A-B pairs of the methods, e.g. attnlrp-gi")
    names = {m: m for m in methods}
    names.update({m.partition("=")[0]: m for m in methods if "=" in m and m.partition("=")[0] not in names})
    known = list(names)
    pairs = []
    for item in items:
        cuts = [(item[:i], item[i + 1:]) for i, c in enumerate(item) if c == "-"]
        valid = [(a, b) for a, b in cuts if a in known and b in known]
        if not valid:
            raise InputError(f"--paired {item!r} is not A-B with A and B among the methods "
                             f"({', '.join(known)})")
        if len(valid) > 1:
            raise InputError(f"--paired {item!r} can be read as " + " or ".join(f"{a} − {b}" for a, b in valid))
        a, b = names[valid[0][0]], names[valid[0][1]]
        if a == b:
            raise InputError(f"--paired {item!r} compares {a} with itself")
        pairs.append((a, b))
    return pairs


def read_results(paths: Iterable[str | Path]) -> list[dict]:
    """The rows of several results (a folder holding ``results.jsonl``, or a ``.jsonl`` / ``.jsonl.gz`` file).
    One (text, method) pair in two of them is an error: which one to compare would be a guess."""
    rows: list[dict] = []
    seen: dict[tuple[int, str], Path] = {}
    for given in paths:
        path = Path(given)
        file = path / RESULTS if path.is_dir() else path
        if not file.is_file():
            raise InputError(f"no results at {given}: give an evaluation folder (with {RESULTS}) or a results "
                             ".jsonl / .jsonl.gz file")
        opener = gzip.open if file.suffix == ".gz" else open
        try:
            with opener(file, "rt", encoding="utf-8") as handle:
                found = [json.loads(line) for line in handle if line.strip()]
        except (OSError, ValueError) as exc:
            raise InputError(f"{file} is not a results file ({str(exc).splitlines()[0]})") from None
        for r in found:
            if not isinstance(r, dict) or "example" not in r or "method" not in r:
                raise InputError(f"{file} holds a line that is not a results row (no example / method)")
            key = (r["example"], r["method"])
            if key in seen and seen[key] != file:
                raise InputError(f"method {r['method']!r} has text {r['example']} in both {seen[key]} and {file}")
            seen[key] = file
        rows += found
    return rows


def difference(rows: Sequence[dict], a: str, b: str, metric: str, seed: int = 0) -> Difference:
    """A − B on ``metric`` per text, over the texts both scored, in text order; mean and bootstrap interval."""
    by = {(r["example"], r["method"]): r.get("metrics", {}).get(metric) for r in rows if "error" not in r}
    texts = sorted({i for (i, m) in by if m == a})
    diffs = [by[(i, a)] - by[(i, b)] for i in texts if by[(i, a)] is not None and by.get((i, b)) is not None]
    return Difference(*bootstrap(diffs, seed), len(diffs))


def metric_names(rows: Sequence[dict]) -> list[str]:
    """The metrics the rows hold, in the registry's order."""
    held = {k for r in rows for k in r.get("metrics", {})}
    return [m for m in M.METRICS if m in held]


def table(rows: Sequence[dict], pairs: Sequence[tuple[str, str]], metrics: Sequence[str] | None = None,
          seed: int = 0) -> dict[str, dict[str, Difference]]:
    """``"A − B"`` (:func:`label`) → metric → :class:`Difference`, for each pair and metric (default: those
    the rows hold)."""
    methods = {r["method"] for r in rows}
    for a, b in pairs:
        for m in (a, b):
            if m not in methods:
                raise InputError(f"no results of method {m!r}; {choices(sorted(methods), m)}")
    metrics = list(metrics) if metrics is not None else metric_names(rows)
    for name in metrics:
        M.METRICS.get(name)
    return {label(a, b): {m: difference(rows, a, b, m, seed) for m in metrics} for a, b in pairs}


def label(a: str, b: str) -> str:
    """``A − B`` with ``LABEL=METHOD`` methods shown by their labels."""
    return f"{a.partition('=')[0]} − {b.partition('=')[0]}"


def texts(cells: dict[str, Difference]) -> str:
    """The texts a row compared: one number, or the range over its columns."""
    counts = sorted({d.n for d in cells.values()})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"


def cell(d: Difference) -> str:
    return f"{d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"


def markdown(result: dict[str, dict[str, Difference]]) -> str:
    """The table in Markdown: a row per pair, a column per metric with its direction."""
    metrics = list(next(iter(result.values()))) if result else []
    lines = ["| A − B | texts | " + " | ".join(f"{m} {M.METRICS.get(m).direction()}" for m in metrics) + " |",
             "|---|---:|" + "---|" * len(metrics)]
    lines += [f"| {pair} | {texts(cells)} | " + " | ".join(cell(cells[m]) for m in metrics) + " |"
              for pair, cells in result.items()]
    return "\n".join(lines)


def csv_text(result: dict[str, dict[str, Difference]]) -> str:
    lines = ["pair,metric,mean,ci_low,ci_high,n"]
    lines += [f"{pair},{m},{d.mean:.6g},{d.low:.6g},{d.high:.6g},{d.n}" for pair, cells in result.items()
              for m, d in cells.items()]
    return "\n".join(lines) + "\n"


def as_json(result: dict[str, dict[str, Difference]]) -> dict:
    return {pair: {m: {"mean": d.mean, "low": d.low, "high": d.high, "n": d.n} for m, d in cells.items()}
            for pair, cells in result.items()}


#: What a reader of the table needs to know, above it.
CAPTION = ("Paired differences A − B per text, mean [95% bootstrap interval over the texts]; ↑/↓: higher/lower is "
           "better, so a difference on the better side favours A. Texts: those both methods scored (a metric "
           "undefined on a text leaves it out of that column).")
