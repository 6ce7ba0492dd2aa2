"""The evaluation runner end to end on the bag-of-words ONNX model (exact answers known), and
its resumability and determinism."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

import bow
import tiny
from listeners import StrictListener
from rulegraph.errors import InputError
from rulegraph.evaluate import metrics as M
from rulegraph.evaluate import runner
from rulegraph.evaluate.summary import bootstrap
from rulegraph.scale import job
from rulegraph.evaluate.runner import Config, Evaluation

TEXTS = ["w1 w2 w3 w4 w5 w6", "w7 w8 w9", "w10 w11 w12 w13 w14 w15 w16 w17 w18 w19", "w20 w21 w22 w23",
         "w24 w25 w26 w27 w28", "w30 w31 w32 w33 w34 w35 w36 w37", "w40 w41", "w50 w51 w52 w53 w54 w55 w56"]
SETTINGS = {"aopc_k": 20, "aopc_step": 10, "lodds_k": 20, "steps": 5, "words": 2}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return bow.build(tmp_path_factory.mktemp("bow"))


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for i, text in enumerate(TEXTS):
            writer.writerow([text, "positive" if i % 2 else 0])
    return path


def config(model, data, methods=("random", "gi", "loo"), **kw):
    return Config(model=str(model), data=str(data), methods=list(methods), metrics=["aopc", "lodds", "hiding"],
                  removal="unk", settings=SETTINGS, batch=3, **kw)


def results(out):
    return [json.loads(line) for line in (out / runner.RESULTS).read_text().splitlines()]


def closed_form_aopc(text: str) -> float:
    """AOPC (k ∈ {0, 10, 20}%) of the ideal order: remove the largest contributions first."""
    ids = [tiny.VOCAB.index(t) for t in text.split()]
    w = bow.weights()[ids]
    s = float(w.sum())
    sign = 1 if s > 0 else -1
    order = sorted(range(len(ids)), key=lambda i: -sign * w[i])
    p = (lambda z: 1 / (1 + math.exp(-z))) if sign > 0 else (lambda z: 1 / (1 + math.exp(z)))
    drops = [p(s) - p(s - sum(w[i] for i in order[:M.count(k / 100, len(ids))])) for k in (0, 10, 20)]
    return sum(drops) / 3


def test_gi_on_the_linear_model_gives_the_closed_form_aopc(model, data, tmp_path):
    summary = Evaluation(config(model, data), tmp_path / "out", progress=False).run()
    rows = {(r["example"], r["method"]): r for r in summary.rows}
    for i, text in enumerate(TEXTS):
        assert rows[i, "gi"]["metrics"]["aopc"] == pytest.approx(closed_form_aopc(text), abs=1e-5)
        # GI and leave-one-out both give the exact contributions here: same ordering, same values
        assert rows[i, "loo"]["metrics"]["aopc"] == pytest.approx(rows[i, "gi"]["metrics"]["aopc"], abs=1e-6)
        # the contributions add up to the explained logit (conservation)
        assert rows[i, "gi"]["relevance_sum"] == pytest.approx(rows[i, "gi"]["logit"], abs=1e-5)
    assert summary.table["gi"]["aopc"]["mean"] >= summary.table["random"]["aopc"]["mean"]
    t = summary.table["gi"]["aopc"]
    assert t["low"] <= t["mean"] <= t["high"] and t["n"] == len(TEXTS)
    out = tmp_path / "out"
    for name in ("table.csv", "summary.json", "curves.png", "conservation.png"):
        assert (out / name).stat().st_size > 0
    lines = (out / "table.csv").read_text().splitlines()
    assert lines[0] == "method,metric,mean,ci_low,ci_high,n" and len(lines) == 1 + 3 * 3
    doc = json.loads((out / "summary.json").read_text())
    assert doc["n_examples"] == len(TEXTS) and doc["removal"] == "unk" and "machine" in doc


def test_the_listener_hears_start_then_each_method_then_stop(model, data, tmp_path):
    """A run, then a report-only run: each start … stop in the order the Listener defines, every
    method heard, and the advances adding up to the start's total."""
    listener = StrictListener()
    Evaluation(config(model, data), tmp_path / "out", listener=listener).run()
    (_, total, pairs), = listener.named("start")
    assert pairs == f"0/{3 * len(TEXTS)} explained"
    assert sum(a[1] for a in listener.named("advance")) == total
    assert listener.named("advance")[-1][2] == f"{3 * len(TEXTS)}/{3 * len(TEXTS)} explained"
    assert {m[1] for m in listener.named("method")} == {"random", "gi", "loo"}
    Evaluation(config(model, data), tmp_path / "out", listener=listener).run(compute=False)
    listener.check(runs=2)


def test_without_progress_the_listener_hears_notes_only(model, data, tmp_path):
    """``progress=False`` (``rulegraph evaluate -q``): the notes reach the listener, the progress does not."""
    listener = StrictListener()
    Evaluation(config(model, data, min_length=5), tmp_path / "out", listener=listener, progress=False).run()
    assert listener.state == "new"
    assert [c[0] for c in listener.calls] == ["note"] and "fewer than 5 tokens" in listener.calls[0][1]


def test_the_model_folder_is_the_model_file_it_holds(model, data, tmp_path):
    """The folder ``rulegraph export`` writes stands for its model.onnx: the same results, one job."""
    folder = Evaluation(config(model.parent, data, n=3), tmp_path / "out", progress=False).run()
    again = Evaluation(config(model, data, n=3), tmp_path / "out", progress=False).run()
    assert len(results(tmp_path / "out")) == 3 * 3
    assert folder.table == again.table


def test_rerun_appends_nothing_and_a_larger_n_only_the_rest(model, data, tmp_path):
    out = tmp_path / "out"
    Evaluation(config(model, data, n=3), out, progress=False).run()
    assert len(results(out)) == 3 * 3
    Evaluation(config(model, data, n=3), out, progress=False).run()
    assert len(results(out)) == 3 * 3
    Evaluation(config(model, data, n=5), out, progress=False).run()
    rows = results(out)
    assert len(rows) == 5 * 3
    assert len({(r["example"], r["method"]) for r in rows}) == 5 * 3


def test_an_interrupted_run_continues_where_it_stopped(model, data, tmp_path, monkeypatch):
    out = tmp_path / "out"
    calls = {"n": 0}
    real = job.methods.explain_with

    def flaky(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*args, **kw)
    monkeypatch.setattr(runner.methods, "explain_with", flaky)
    with pytest.raises(KeyboardInterrupt):
        Evaluation(config(model, data), out, progress=False).run()
    partial = results(out)
    assert 0 < len(partial) < len(TEXTS) * 3
    with (out / runner.RESULTS).open("a") as handle:
        handle.write('{"example": 99, "meth')            # a line cut short by the interruption
    monkeypatch.setattr(runner.methods, "explain_with", real)
    Evaluation(config(model, data), out, progress=False).run()
    rows = results(out)
    assert rows[:len(partial)] == partial                # kept, not recomputed
    assert len(rows) == len(TEXTS) * 3
    assert sorted((r["example"], r["method"]) for r in rows) == sorted(
        (i, m) for i in range(len(TEXTS)) for m in ("random", "gi", "loo"))


def test_results_are_deterministic_given_the_seed(model, data, tmp_path):
    def values(out, seed):
        summary = Evaluation(config(model, data, seed=seed), out, progress=False).run()
        return {(r["example"], r["method"]): r["metrics"] for r in summary.rows}, summary.table
    a, table_a = values(tmp_path / "a", 0)
    b, table_b = values(tmp_path / "b", 0)
    assert a == b and table_a == table_b
    c, _ = values(tmp_path / "c", 1)
    assert any(a[k] != c[k] for k in a if k[1] == "random")
    assert all(a[k] == c[k] for k in a if k[1] != "random")


def test_other_settings_refuse_to_mix_with_stored_results(model, data, tmp_path):
    out = tmp_path / "out"
    Evaluation(config(model, data, n=2), out, progress=False).run()
    with pytest.raises(InputError, match="other settings .*removal"):
        Evaluation(Config(**{**config(model, data, n=2).__dict__, "removal": "delete"}), out, progress=False).run()
    Evaluation(Config(**{**config(model, data, n=2).__dict__, "removal": "delete"}), out, force=True,
               progress=False).run()
    assert len(results(out)) == 2 * 3


def test_bad_input_is_an_input_error(model, data, tmp_path):
    with pytest.raises(InputError, match="unknown metric 'aupc'"):
        Evaluation(Config(model=str(model), data=str(data), methods=["gi"], metrics=["aupc"]), tmp_path)
    with pytest.raises(InputError, match="unknown method"):
        Evaluation(config(model, data, methods=["gi", "nope"]), tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("sentence,label\nw1,0\n")
    with pytest.raises(InputError, match="no `text` column"):
        Evaluation(config(model, bad), tmp_path / "o", progress=False).run()
    bad.write_text("text,label\nw1,maybe\n")
    with pytest.raises(InputError, match="label 'maybe'"):
        Evaluation(config(model, bad), tmp_path / "o2", progress=False).run()


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    values = list(np.random.default_rng(0).normal(size=50))
    assert bootstrap(values, 0) == bootstrap(values, 0)
    mean, low, high = bootstrap(values, 0)
    assert low < mean < high and mean == pytest.approx(np.mean(values))


def test_a_method_that_fails_on_every_text_fails_the_run(model, data, tmp_path):
    rules = tmp_path / "partial.yaml"
    rules.write_text("name: partial\ndescription: only Gather has a rule\nboundary: embeddings\n"
                     "on_unmatched: error\nrules:\n  - op: [Gather]\n    rule: route\n")
    evaluation = Evaluation(config(model, data, methods=("gi", str(rules))), tmp_path / "out", progress=False)
    with pytest.raises(InputError, match=r"failed on every text \(8 of 8\): .*no rule matches node 'mul'"):
        evaluation.run()


@pytest.fixture
def flaky():
    """A method that fails on the texts holding the token w7 (the random baseline otherwise)."""
    import dataclasses
    from rulegraph.methods.base import BASELINES
    base = BASELINES.get("random")
    w7 = tiny.VOCAB.index("w7")

    def run(req, **options):
        if bool((req.inputs["input_ids"] == w7).any()):
            raise InputError("flaky: cannot explain w7")
        return base.run(req, **options)
    BASELINES.add("flaky", dataclasses.replace(base, name="flaky", run=run))
    yield "flaky"
    BASELINES.remove("flaky")


def test_a_method_that_fails_on_some_texts_is_recorded_per_text_and_counted(model, data, tmp_path, flaky):
    summary = Evaluation(config(model, data, methods=("gi", flaky)), tmp_path / "out", progress=False).run()
    assert summary.failed == {"flaky": {"texts": 1, "of": len(TEXTS), "error": "flaky: cannot explain w7",
                                        "examples": [1]}}
    assert summary.table["flaky"]["aopc"]["n"] == len(TEXTS) - 1 and summary.table["gi"]["aopc"]["n"] == len(TEXTS)
    rows = [r for r in results(tmp_path / "out") if r["method"] == "flaky"]
    assert len(rows) == len(TEXTS) and [r["error"] for r in rows if "error" in r] == ["flaky: cannot explain w7"]
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert doc["failed"]["flaky"]["texts"] == 1
    again = Evaluation(config(model, data, methods=("gi", flaky)), tmp_path / "out", progress=False).run()
    assert again.failed == summary.failed and len(results(tmp_path / "out")) == 2 * len(TEXTS)   # not retried


def test_precision_at_k_reads_the_answer_column(model, tmp_path):
    text = "w1 w2 w3 w4 w5 w6"
    ids = [tiny.VOCAB.index(t) for t in text.split()]
    w = bow.weights()[ids]
    best = text.split()[int(np.argmax(w if w.sum() > 0 else -w))]
    path = tmp_path / "qa.csv"
    path.write_text(f"text,answer\n{text},{best}\n{text},\n")
    cfg = Config(model=str(model), data=str(path), methods=["gi"], metrics=["precision@k"],
                 settings={"precision_k": 1})
    summary = Evaluation(cfg, tmp_path / "out", progress=False).run()
    values = [r["metrics"]["precision@k"] for r in sorted(summary.rows, key=lambda r: r["example"])]
    assert values == [1.0, None]                  # the second row has no answer: no value
    assert summary.table["gi"]["precision@k"] == {"mean": 1.0, "low": 1.0, "high": 1.0, "n": 1}


def test_report_only_aggregates_the_texts_every_method_finished(model, data, tmp_path):
    out = tmp_path / "out"
    Evaluation(config(model, data, methods=("gi", "loo"), n=4), out, progress=False).run()
    Evaluation(config(model, data, methods=("gi",)), out, progress=False).run()      # gi: all 8, loo: 4
    before = (out / runner.RESULTS).read_text()
    summary = Evaluation(config(model, data, methods=("gi", "loo")), out, progress=False).run(compute=False)
    assert (out / runner.RESULTS).read_text() == before
    assert summary.n_examples == 4
    assert summary.table["gi"]["aopc"]["n"] == summary.table["loo"]["aopc"]["n"] == 4


def test_a_run_moved_elsewhere_resumes_and_other_weights_are_refused(model, data, tmp_path):
    """The model and data are known by content: copies in another folder continue the run;
    the same path with other bytes does not mix with it."""
    out = tmp_path / "out"
    Evaluation(config(model, data, n=2), out, progress=False).run()
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in (model.name, "tokenizer.json"):
        (moved / name).write_bytes((model.parent / name).read_bytes())
    (moved / data.name).write_bytes(data.read_bytes())
    Evaluation(config(moved / model.name, moved / data.name, n=3), out, progress=False).run()
    assert len(results(out)) == 3 * 3
    (moved / data.name).write_text(data.read_text().replace("w1 ", "w2 "))
    with pytest.raises(InputError, match=r"other settings \(data\)"):
        Evaluation(config(moved / model.name, moved / data.name, n=3), out, progress=False).run()


def test_the_committed_runs_keep_their_identity():
    """The settings of the committed evaluations resolve to what their config.json holds, so
    `make eval` continues them."""
    from pathlib import Path
    docs = Path(__file__).resolve().parents[2] / "docs" / "evaluation"
    for part, words in (("rt", 4), ("imdb", 4)):
        stored = json.loads((docs / f"{part}-config.json").read_text())
        given = {"aopc_k": 20, "aopc_step": 10, "lodds_k": 20, "steps": 5, "words": words}
        assert M.settings(given) == stored["settings"]
        assert list(M.settings(given)) == list(stored["settings"])      # same keys, same order


def test_summary_states_the_score_quantities_and_the_timing(model, data, tmp_path):
    Evaluation(config(model, data, methods=("random", "gi", "loo"), n=2), tmp_path / "out", progress=False).run()
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert doc["scores"] == {"random": "random number in [0, 1)", "gi": "relevance (logit units)", "loo": "logit drop"}
    assert "warm-up" in doc["timing"]


def test_a_rule_file_changed_since_refuses_to_mix_its_rows(model, data, tmp_path):
    """A method read from a rule file is known by what it decides on the model (its binding's fingerprint):
    a comment added resumes; another rule is refused, naming the method, before any row is written; the
    changed file under another label, and a method added, evaluate beside the rows already there."""
    rules = tmp_path / "mine.yaml"
    rules.write_text("name: mine\nboundary: embeddings\nrules:\n  - trait: routing\n    rule: route\n"
                     "  - op: \"*\"\n    rule: gradient\n")
    out = tmp_path / "out"
    Evaluation(config(model, data, methods=("gi", f"mine={rules}"), n=2), out, progress=False).run()
    rules.write_text(rules.read_text() + "# a comment\n")
    Evaluation(config(model, data, methods=(f"mine={rules}",), n=3), out, progress=False).run()
    assert len(results(out)) == 2 * 2 + 1
    rules.write_text(rules.read_text().replace("rule: gradient", "rule: epsilon"))
    before = (out / runner.RESULTS).read_text()
    with pytest.raises(InputError, match=rf"holds results of mine={rules} made with other rules"):
        Evaluation(config(model, data, methods=("gi", f"mine={rules}"), n=4), out, progress=False).run()
    assert (out / runner.RESULTS).read_text() == before
    Evaluation(config(model, data, methods=(f"eps={rules}", "loo"), n=2), out, progress=False).run()
    assert len(results(out)) == 2 * 2 + 1 + 2 * 2
    stored = json.loads((out / job.CONFIG).read_text())[job.MEMBERS]
    assert sorted(stored) == sorted(["gi", f"mine={rules}", f"eps={rules}"])        # (baselines have none)
