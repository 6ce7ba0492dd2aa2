"""A tuning run end to end on the linear bag-of-words model (tests/bow.py), where the exact
contributions and the AOPC of the ideal order are known in closed form: the planted rule is found,
its tune figure is the closed form's, the tuned file round-trips and explains exactly, a stopped run
resumes, a leaking trial is flagged and not chosen."""
from __future__ import annotations

import csv
import json
import math
import random

import numpy as np
import pyarrow.parquet as pq
import pytest

import bow
import tiny
from rulegraph.api import explain
from rulegraph.errors import InputError
from rulegraph.evaluate import metrics as M
from rulegraph.ruleset import RuleSet
from rulegraph.tune import runner as R
from rulegraph.tune.split import read_records, split

pytest.importorskip("optuna")

#: AOPC over k ∈ {0, 10, 20} % (the closed form below)
SETTINGS = {"aopc_k": 20, "aopc_step": 10}
#: ReduceSum (the logits' sum over the tokens) stops all relevance: a bad start
START = """\
name: bow-start
boundary: embeddings
on_unmatched: error
rules:
  - op: ReduceSum
    rule: stop
  - op: "*"
    rule: gradient
"""
#: the planted space: stop the relevance, or pass it on exactly (the z-rule: the gradient)
SPACE = """\
space:
  - id: sum
    op: ReduceSum
    choose:
      stop: {}
      gradient: {}
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    model = bow.build(root / "model")
    rng = random.Random(0)
    with (root / "data.csv").open("w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(["text", "label"])
        for i in range(12):
            w.writerow([" ".join(f"w{rng.randrange(1, 95)}" for _ in range(6)), i % 2])
    (root / "start.yaml").write_text(START)
    (root / "space.yaml").write_text(SPACE)
    return root, model


def settings(files, out, **kw) -> R.Settings:
    root, model = files
    given = dict(model=str(model), data=str(root / "data.csv"), start=str(root / "start.yaml"), metric="aopc",
                 out=str(out), space=str(root / "space.yaml"), trials=4, settings=SETTINGS)
    return R.Settings(**{**given, **kw})


class Notes(R.TuneListener):
    """What a run says, as (level, text)."""

    def __init__(self):
        self.said = []

    def note(self, text, level="info"):
        self.said.append((level, text))


def closed_form_aopc(text: str) -> float:
    """AOPC (k ∈ {0, 10, 20} %) of the ideal order on the bag-of-words model: the largest contributions
    to the predicted class removed first (a removed token counts 0: [UNK] has weight 0)."""
    ids = [tiny.VOCAB.index(t) for t in text.split()]
    w = bow.weights()[ids]
    s = float(w.sum())
    sign = 1 if s > 0 else -1
    order = sorted(range(len(ids)), key=lambda i: -sign * w[i])
    p = (lambda z: 1 / (1 + math.exp(-sign * z)))
    return sum(p(s) - p(s - sum(w[i] for i in order[:M.count(k / 100, len(ids))])) for k in (0, 10, 20)) / 3


def test_a_run_finds_the_planted_rule_and_reports_it_on_the_test_part(files, tmp_path):
    exact = files[0] / "exact.yaml"         # the gradient everywhere: what the tuned set should equal here
    exact.write_text("name: exact\nboundary: embeddings\nrules:\n  - op: '*'\n    rule: gradient\n")
    notes = Notes()
    result = R.Tuning(settings(files, tmp_path / "out", against=[str(exact)]), notes).run()
    out = tmp_path / "out"
    tuned = RuleSet.load(out / "tuned.yaml")          # loads like any rule file
    assert tuned.entries[0].ops == ("ReduceSum",) and tuned.entries[0].rule.name == "gradient"
    assert tuned.name == "bow-start-tuned"
    # its figure on the tune part is the closed form's (the exact contributions order the tokens ideally)
    records = read_records(files[0] / "data.csv")
    parts = split(records, 0)
    assert result.sizes == parts.sizes() == {"tune": 7, "validation": 2, "test": 3}
    expected = np.mean([closed_form_aopc(records[i]["text"]) for i in parts.parts["tune"]])
    assert result.tune == pytest.approx(expected, abs=1e-5)
    # on test: the paired difference against the start is the difference of the means over the same texts
    t = result.test
    tuned_mean, start_mean = t[f"trial-{result.trial}"]["mean"], t["start"]["mean"]
    assert result.paired["n"] == 3
    assert result.paired["mean"] == pytest.approx(tuned_mean - start_mean, abs=1e-9)
    assert result.paired["low"] <= result.paired["mean"] <= result.paired["high"]
    assert result.paired["mean"] > 0
    assert result.against == {"against1": {"mean": 0.0, "low": 0.0, "high": 0.0, "n": 3}}
    header = [line for line in (out / "tuned.yaml").read_text().splitlines() if line.startswith("#")]
    assert len(header) == 5
    assert header[4].startswith(f"# Against {exact}: paired difference tuned − it +0 [95% bootstrap +0, +0] over 3")
    assert "Metric: aopc (higher is better), protocol default" in header[1]
    assert "tune 7, validation 2, test 3 texts" in header[2]
    assert f"paired difference tuned − {files[0] / 'start.yaml'} {result.paired['mean']:+.4g}" in header[3]
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    assert [r["trial"] for r in rows] == [0, 1, 2, 3]
    assert [r["rules"] for r in rows] == [f"trials/{n:04d}.yaml" for n in range(4)]     # within the folder
    assert all((out / r["rules"]).is_file() for r in rows)
    assert sum(r["chosen"] for r in rows) == 1 and rows[result.trial]["param.sum.rule"] == "gradient"
    assert {r["param.sum.rule"] for r in rows} == {"stop", "gradient"}   # both were tried (seed 0)
    for r in rows:              # a stop's tokens carry nothing; the gradient's all of the logit
        assert r["tokens_share"] == pytest.approx(0.0 if r["param.sum.rule"] == "stop" else 1.0, abs=1e-6)
    first = {}                  # 4 trials of 2 choices: rules repeat, and a repeat is not evaluated again
    for r in rows:
        earlier = first.setdefault(r["param.sum.rule"], r)
        if earlier is r:
            assert r["same_as"] is None and (out / "evals" / f"tune-{r['trial']:04d}").is_dir()
        else:
            assert r["same_as"] == earlier["trial"] and r["value"] == earlier["value"]
            assert r["tokens_share"] == earlier["tokens_share"]
            assert not (out / "evals" / f"tune-{r['trial']:04d}").exists()
    assert sum(r["same_as"] is not None for r in rows) == 2
    assert json.loads((out / "tune.json").read_text())["distinct"] == 2
    assert ("info", "2 of 4 finished trials bound the model's nodes to the rules of an earlier trial (its score "
                    "taken, no evaluation): 2 distinct rule sets were scored; repeats cost nothing, so more --trials "
                    "explore more") in notes.said
    assert (out / "trials.png").stat().st_size > 0
    assert (out / "split.csv").read_text().count("\n") == 13
    assert (out / "tune.json").stat().st_size > 0


def test_the_tuned_file_explains_with_the_exact_contributions(files, tmp_path):
    R.Tuning(settings(files, tmp_path / "out", trials=3)).run()
    text = "w3 w17 w42 w8"
    e = explain(str(files[1]), str(tmp_path / "out" / "tuned.yaml"), text=text, target=1)
    w = bow.weights()[[tiny.VOCAB.index(t) for t in text.split()]]
    scores = e.scores()
    words = [s for s, tok in zip(scores, e.tokens[0]) if tok in text.split()]
    assert words == pytest.approx((w / 2).tolist(), abs=1e-6)


def test_a_stopped_run_resumes_and_more_trials_extend_it(files, tmp_path, monkeypatch):
    out = tmp_path / "out"
    objective = R.Tuning.objective

    def stopped(self, trial, chosen):
        if trial.number == 1:
            raise KeyboardInterrupt
        return objective(self, trial, chosen)

    monkeypatch.setattr(R.Tuning, "objective", stopped)
    with pytest.raises(KeyboardInterrupt):
        R.Tuning(settings(files, out, trials=2)).run()
    monkeypatch.setattr(R.Tuning, "objective", objective)
    R.Tuning(settings(files, out, trials=2)).run()
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    assert [(r["state"], r["interrupted"]) for r in rows] == [("complete", False), ("fail", True), ("complete", False)]
    R.Tuning(settings(files, out, trials=4)).run()
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    assert [r["state"] for r in rows] == ["complete", "fail", "complete", "complete", "complete"]
    split_before = (out / "split.csv").read_text()
    with pytest.raises(InputError, match="other settings \\(metric, seed differ\\)"):
        R.Tuning(settings(files, out, metric="lodds", seed=3)).run()
    assert (out / "split.csv").read_text() == split_before         # refused before anything changed
    R.Tuning(settings(files, out, metric="lodds", trials=2, force=True)).run()      # --force: a new study
    assert len(pq.read_table(out / "trials.parquet")) == 2


def test_a_study_resumes_after_its_start_changed_where_the_model_binds_as_before(files, tmp_path):
    """An entry for an op the model lacks changes the start's text, not its rules: the study resumes (and records
    the new text); a change of a rule the model's nodes take is refused. A study recorded before the bound
    rules were part of its identity is judged by the text alone."""
    from rulegraph.tune import search
    out, start = tmp_path / "out", tmp_path / "start.yaml"
    start.write_text(START)
    R.Tuning(settings(files, out, start=str(start), trials=2)).run()
    start.write_text(START.replace("rules:\n", "rules:\n  - op: Conv\n    rule: zplus\n"))
    R.Tuning(settings(files, out, start=str(start), trials=3)).run()
    assert len(pq.read_table(out / "trials.parquet")) == 3
    start.write_text(START.replace("rule: stop", "rule: gradient"))
    with pytest.raises(InputError, match=r"other settings \(start, start_rules differ\)"):
        R.Tuning(settings(files, out, start=str(start), trials=4)).run()
    older = tmp_path / "older.db"                   # an identity without start_rules, as earlier versions wrote
    held = {"seed": 0, "start": "a"}
    search.open_study(f"sqlite:///{older}", "maximize", held)
    study = search.open_study(f"sqlite:///{older}", "maximize", {**held, "start_rules": "b"},
                              equivalent={"start": "start_rules"})
    assert study.user_attrs["identity"] == {**held, "start_rules": "b"}
    with pytest.raises(InputError, match=r"\(start differ\)"):
        search.open_study(f"sqlite:///{tmp_path / 'older2.db'}", "maximize", held)
        search.open_study(f"sqlite:///{tmp_path / 'older2.db'}", "maximize", {"seed": 0, "start": "c",
                                                                            "start_rules": "b"},
                          equivalent={"start": "start_rules"})


def test_a_study_resumes_after_its_spaces_text_changed_where_it_samples_the_same(files, tmp_path):
    """A comment and a description in the space file resume the study; another candidate rule is refused."""
    out, space = tmp_path / "out", tmp_path / "space.yaml"
    space.write_text(SPACE)
    R.Tuning(settings(files, out, space=str(space), trials=2)).run()
    space.write_text("# the planted space\ndescription: stop or pass on\n"
                     + SPACE.replace("stop: {}", "stop: {}  # none"))
    R.Tuning(settings(files, out, space=str(space), trials=3)).run()
    assert len(pq.read_table(out / "trials.parquet")) == 3
    space.write_text(SPACE + "      zero: {}\n")
    with pytest.raises(InputError, match=r"other settings \(space, space_content differ\)"):
        R.Tuning(settings(files, out, space=str(space), trials=4)).run()


def test_a_trial_whose_constants_absorb_too_much_is_flagged_and_not_chosen(files, tmp_path):
    root = files[0]
    (root / "leaky.yaml").write_text("space:\n  - id: sum\n    op: ReduceSum\n    choose:\n"
                                     "      epsilon: {epsilon: {log: [1.0e-2, 1.0e+2]}}\n")
    result = R.Tuning(settings(files, tmp_path / "out", space=str(root / "leaky.yaml"), trials=4,
                               max_leak=0.5, finalists=4)).run()
    rows = pq.read_table(tmp_path / "out" / "trials.parquet").to_pylist()
    for r in rows:
        leaks = abs(r["absorbed_share"]) > 0.5
        assert bool(r["flag"]) == leaks, r
        assert r["tokens_share"] + r["absorbed_share"] == pytest.approx(1.0, abs=1e-5)     # the ε-rule conserves
    assert any(r["flag"] for r in rows) and not all(r["flag"] for r in rows)
    assert not rows[result.trial]["flag"] and set(result.flagged) == {r["trial"] for r in rows if r["flag"]}
    assert "constants absorb" in next(r["flag"] for r in rows if r["flag"])


def test_median_pruning_stops_a_trial_behind_on_half_the_tune_part(files, tmp_path):
    # seed 0 samples gradient, gradient, stop, gradient (see above): the stop trial is behind the two
    # finished ones on the first half of the tune texts, so it stops there
    result = R.Tuning(settings(files, tmp_path / "out", prune=True)).run()
    rows = pq.read_table(tmp_path / "out" / "trials.parquet").to_pylist()
    assert [(r["param.sum.rule"], r["state"]) for r in rows] == \
        [("gradient", "complete"), ("gradient", "complete"), ("stop", "pruned"), ("gradient", "complete")]
    assert rows[result.trial]["param.sum.rule"] == "gradient"


def test_conserving_restricts_the_space(files, tmp_path):
    result = R.Tuning(settings(files, tmp_path / "out", conserving=True, trials=2)).run()
    rows = pq.read_table(tmp_path / "out" / "trials.parquet").to_pylist()
    assert all("param.sum.rule" not in r for r in rows)           # one rule left: nothing to choose
    assert RuleSet.load(tmp_path / "out" / "tuned.yaml").entries[0].rule.name == "gradient"
    assert result.flagged == {}


def test_a_second_run_in_the_same_folder_is_refused(files, tmp_path):
    from rulegraph.files import FolderLock
    (tmp_path / "out").mkdir()
    held = FolderLock(tmp_path / "out", "a tuning study")
    held.acquire()
    try:
        with pytest.raises(InputError, match="is in use by another run .* writing a tuning study"):
            R.Tuning(settings(files, tmp_path / "out")).run()
    finally:
        held.release()
    assert not (tmp_path / "out" / "study.db").exists()


def test_on_ray_the_trials_and_the_report_are_the_local_engines(files, tmp_path):
    """``--engine ray`` (``Tuning(…, engine=)``): each evaluation's texts explained and scored on Ray workers,
    the same trial figures, choice and test report as in this process (one torch thread each, as a worker)."""
    ray = pytest.importorskip("ray", reason="the ray extra (pip install 'rulegraph[ray]'); `make test` installs it")
    import torch
    from rulegraph.scale import engine
    torch.set_num_threads(1)
    local = R.Tuning(settings(files, tmp_path / "local", trials=2, finalists=1)).run()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        remote = R.Tuning(settings(files, tmp_path / "ray", trials=2, finalists=1),
                          engine=engine("ray", num_workers=2)).run()
    finally:
        ray.shutdown()
    assert (remote.trial, remote.tune, remote.validation) == (local.trial, local.tune, local.validation)
    assert (remote.test, remote.paired) == (local.test, local.paired)
    figures = ("trial", "value", "param.sum.rule", "tokens_share")
    rows = [pq.read_table(tmp_path / run / "trials.parquet").to_pylist() for run in ("local", "ray")]
    assert [[r[k] for k in figures] for r in rows[0]] == [[r[k] for k in figures] for r in rows[1]]


def test_an_entry_that_selects_no_node_is_named_before_the_search_and_in_tune_json(files, tmp_path):
    root, _ = files
    (tmp_path / "space.yaml").write_text(SPACE + "  - id: conv\n    op: Conv\n    choose:\n"
                                                 "      gamma: {gamma: {log: [1.0e-3, 1.0]}}\n")
    notes = Notes()
    R.Tuning(settings(files, tmp_path / "out", space=str(tmp_path / "space.yaml"), trials=1), notes).run()
    warned = [text for level, text in notes.said if level == "warning"]
    assert warned == [f"{tmp_path / 'space.yaml'}:7: conv.gamma.gamma changes no rule of this model's nodes (none "
                      "is selected, or an earlier entry of the starting rule set or a per_layer item takes them): "
                      "its samples cannot move a score"]
    assert json.loads((tmp_path / "out" / "tune.json").read_text())["inert"] == ["conv.gamma.gamma"]
