"""Paired differences (rulegraph/evaluate/paired.py): ``rulegraph compare`` and ``rulegraph evaluate --paired``
against the bootstrap computed here from the rows (numpy, the runner's seed and resample count), the committed
paired table of docs/evaluation.md reproduced by the command, and the parsing of ``A-B`` pairs of hyphenated names."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import bow
from rulegraph.cli import main
from rulegraph.errors import InputError
from rulegraph.evaluate import paired
from rulegraph.evaluate.summary import BOOTSTRAP

DOCS = Path(__file__).resolve().parents[2] / "docs" / "evaluation"


def reference(rows, a, b, metric, seed=0):
    """Per text (in text order) A − B where both have the metric; mean and 2.5/97.5 percentiles of BOOTSTRAP
    resampled means, resampled as the runner does (numpy's default_rng(seed).integers)."""
    by = {(r["example"], r["method"]): r["metrics"].get(metric) for r in rows if "error" not in r}
    texts = sorted(i for (i, m) in by if m == a)
    d = np.array([by[(i, a)] - by[(i, b)] for i in texts
                  if by[(i, a)] is not None and by.get((i, b)) is not None], dtype=np.float64)
    means = d[np.random.default_rng(seed).integers(0, len(d), (BOOTSTRAP, len(d)))].mean(1)
    return d.mean(), *np.percentile(means, [2.5, 97.5]), len(d)


def synthetic(path: Path) -> list[dict]:
    """Rows of three methods on 40 texts, written out of text order (as an engine may), one failed row and
    one metric missing on one text."""
    rng = np.random.default_rng(3)
    rows = []
    for i in rng.permutation(40).tolist():
        for method, shift in (("lrp-ah-ln", 0.1), ("lrp-ah", 0.0), ("gi", -0.05)):
            if (i, method) == (7, "gi"):
                rows.append({"example": i, "method": method, "error": "boom"})
                continue
            metrics = {"aopc": float(rng.normal(shift, 0.1)), "lodds": float(rng.normal(-shift, 0.2))}
            if (i, method) == (11, "lrp-ah"):
                metrics["lodds"] = None
            rows.append({"example": i, "method": method, "metrics": metrics})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_compare_gives_the_bootstrap_of_the_per_text_differences(tmp_path):
    rows = synthetic(tmp_path / "results.jsonl")
    csv_path = tmp_path / "paired.csv"
    assert main(["compare", str(tmp_path), "--paired", "lrp-ah-ln-lrp-ah,lrp-ah-ln-gi", "--csv", str(csv_path)]) == 0
    got = {(line.split(",")[0], line.split(",")[1]): [float(v) for v in line.split(",")[2:]]
           for line in csv_path.read_text().splitlines()[1:]}
    for (a, b) in (("lrp-ah-ln", "lrp-ah"), ("lrp-ah-ln", "gi")):
        for metric in ("aopc", "lodds"):
            mean, low, high, n = reference(rows, a, b, metric)
            assert got[(f"{a} − {b}", metric)] == pytest.approx([mean, low, high, n], rel=1e-5), (a, b, metric)
    assert got[("lrp-ah-ln − gi", "aopc")][3] == 39 and got[("lrp-ah-ln − lrp-ah", "lodds")][3] == 39
    # the same from the library, any row order (a resumed or Ray run writes rows in another order)
    shuffled = list(reversed(rows))
    assert paired.table(shuffled, [("lrp-ah-ln", "gi")]) == paired.table(rows, [("lrp-ah-ln", "gi")])


def test_compare_reproduces_the_committed_paired_table_of_the_docs(tmp_path):
    """docs/evaluation/rt-paired.md, written by examples/sentiment/paired.py, is what the command gives
    from the committed per-text results."""
    committed = (DOCS / "rt-paired.md").read_text().splitlines()
    rows = [line for line in committed if line.startswith("| ") and " − " in line and not line.startswith("| A − B")]
    pairs = ",".join(line.split(" | ")[0].removeprefix("| ").replace(" − ", "-") for line in rows)
    out = tmp_path / "rt-paired.md"
    assert main(["compare", str(DOCS / "rt-results.jsonl.gz"), "--paired", pairs, "--markdown", str(out)]) == 0
    mine = [line for line in out.read_text().splitlines() if line.startswith("| ") and not line.startswith("| A − B")]
    assert mine == rows and len(rows) == 8


def test_evaluate_paired_writes_what_compare_computes(tmp_path):
    model = bow.build(tmp_path / "bow")
    data = tmp_path / "texts.csv"
    data.write_text("text\n" + "".join(f"w{i} w{i + 1} w{i + 3} w{i + 7} w{i + 9}\n" for i in range(1, 60, 4)))
    out = tmp_path / "run"
    assert main(["evaluate", str(model), "--data", str(data), "--methods", "gi,random,lp=lrp-ah-ln",
                 "--metrics", "aopc,lodds", "--aopc-k", "20", "--aopc-step", "10", "--paired", "gi-random,lp-gi",
                 "-o", "lp.score=logprob", "--out", str(out), "--quiet"]) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert set(doc["paired"]) == {"gi − random", "lp − gi"}
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for pair, (a, b) in (("gi − random", ("gi", "random")), ("lp − gi", ("lp=lrp-ah-ln", "gi"))):
        for metric in ("aopc", "lodds"):
            mean, low, high, n = reference(rows, a, b, metric)
            cell = doc["paired"][pair][metric]
            assert [cell["mean"], cell["low"], cell["high"], cell["n"]] == pytest.approx([mean, low, high, n])
    # on a linear model every rule set is exact: explaining log p ranks the tokens as the logit does
    assert doc["paired"]["lp − gi"]["aopc"]["mean"] == pytest.approx(0, abs=1e-12)
    assert (out / "paired.csv").read_text().startswith("pair,metric,mean,ci_low,ci_high,n")
    assert doc["scores"]["lp=lrp-ah-ln"] == "relevance of log p (p held)"


def test_pairs_of_hyphenated_names_are_read_against_the_methods():
    methods = ["lrp-ah-ln", "lrp-ah", "gi", "mask-lrp-rollout", "lp=lrp-ah-ln"]
    assert paired.parse_pairs("lrp-ah-ln-lrp-ah, gi-lrp-ah-ln", methods) == [("lrp-ah-ln", "lrp-ah"),
                                                                            ("gi", "lrp-ah-ln")]
    assert paired.parse_pairs("mask-lrp-rollout-lp", methods) == [("mask-lrp-rollout", "lp=lrp-ah-ln")]
    with pytest.raises(InputError, match="not A-B with A and B among the methods"):
        paired.parse_pairs("gi-ig", methods)
    with pytest.raises(InputError, match="with itself"):
        paired.parse_pairs("gi-gi", methods)
    with pytest.raises(InputError, match="can be read as a − b-c or a-b − c"):
        paired.parse_pairs("a-b-c", ["a", "b-c", "a-b", "c"])
    with pytest.raises(InputError, match="--paired is empty"):
        paired.parse_pairs(" , ", methods)


def test_results_given_twice_or_missing_are_refused(tmp_path):
    synthetic(tmp_path / "results.jsonl")
    with gzip.open(tmp_path / "copy.jsonl.gz", "wt") as handle:
        handle.write((tmp_path / "results.jsonl").read_text())
    with pytest.raises(InputError, match="in both"):
        paired.read_results([tmp_path, tmp_path / "copy.jsonl.gz"])
    with pytest.raises(InputError, match="no results at"):
        paired.read_results([tmp_path / "nothing"])
    with pytest.raises(InputError, match="no results of method 'ig'"):
        paired.table(paired.read_results([tmp_path]), [("ig", "gi")])
    assert main(["compare", str(tmp_path), "--paired", "gi-ig"]) == 2
