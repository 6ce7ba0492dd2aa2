"""The search: TPE finds a planted optimum, is deterministic under its seed, resumes a stopped run
(the trial it left running failed and replaced), refuses a study of other settings."""
from __future__ import annotations

import math
import sys

import pytest

from rulegraph.errors import InputError, MissingDependency, RuleFileError
from rulegraph.tune import search
from rulegraph.tune import space as S

optuna = pytest.importorskip("optuna")

#: ε log-uniform over 9 decades and a rule among three: the optimum planted at ε = 1e-3 with rule `zplus`
SPACE = S.parse("""\
space:
  - id: lin
    op: Gemm
    choose:
      epsilon: {epsilon: {log: [1.0e-9, 1.0]}}
  - id: conv
    op: Conv
    choose:
      gamma: {gamma: {uniform: [0.0, 1.0]}}
      zplus: {}
      flat: {}
""", "planted.yaml")


def planted(trial, chosen: dict) -> float:
    """Highest (0) at ε = 1e-3 and rule zplus; γ is a distraction worth less than the rule."""
    eps = chosen["lin"]["params"]["epsilon"]
    rule = chosen["conv"]["rule"]
    return -(math.log10(eps) + 3) ** 2 - {"zplus": 0.0, "gamma": 2.0, "flat": 4.0}[rule]


def study(tmp_path, name="s.db", identity=None):
    return search.open_study(f"sqlite:///{tmp_path / name}", "maximize", identity or {"seed": 0})


def params(s) -> list[dict]:
    return [t.params for t in s.trials if t.state == optuna.trial.TrialState.COMPLETE]


def test_tpe_finds_the_planted_optimum(tmp_path):
    s = study(tmp_path)
    search.optimize(s, SPACE, planted, 40, seed=0)
    best = search.finished(s)[0]
    assert best.params["conv.rule"] == "zplus"
    assert abs(math.log10(best.params["lin.epsilon.epsilon"]) + 3) < 0.5
    # better than random sampling of the same number of trials would be expected to get: the last 20
    # trials (TPE's, after its 10 random ones) pick zplus most of the time
    late = [t.params["conv.rule"] for t in s.trials[20:]]
    assert late.count("zplus") > len(late) / 2


def test_the_same_seed_samples_the_same_trials_and_another_seed_others(tmp_path):
    a, b, c = study(tmp_path, "a.db"), study(tmp_path, "b.db"), study(tmp_path, "c.db")
    search.optimize(a, SPACE, planted, 12, seed=5)
    search.optimize(b, SPACE, planted, 12, seed=5)
    search.optimize(c, SPACE, planted, 12, seed=6)
    assert params(a) == params(b)
    assert params(a) != params(c)


def test_a_stopped_run_resumes_as_if_it_had_not_stopped(tmp_path):
    whole = study(tmp_path, "whole.db")
    search.optimize(whole, SPACE, planted, 4, seed=1)

    calls = []

    def killed(trial, chosen):
        calls.append(trial.number)
        if trial.number == 2:
            raise KeyboardInterrupt         # the run stops mid-trial: the trial stays `running` in the study
        return planted(trial, chosen)

    with pytest.raises(KeyboardInterrupt):
        search.optimize(study(tmp_path, "stopped.db"), SPACE, killed, 4, seed=1)
    resumed = study(tmp_path, "stopped.db")           # a new process: the study read back from SQLite
    assert [t.state.name for t in resumed.trials] == ["COMPLETE", "COMPLETE", "RUNNING"]
    search.optimize(resumed, SPACE, planted, 4, seed=1)
    states = [t.state.name for t in resumed.trials]
    assert states == ["COMPLETE", "COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert search.interrupted(resumed) == [2]
    assert search.counted(resumed) == 4
    # the trials that count sample what the run that did not stop sampled (the n-th counted trial's
    # sampler is seeded with seed + n; TPE learns from finished trials only)
    assert params(resumed) == params(whole)


def test_more_trials_extend_the_study(tmp_path):
    s = study(tmp_path)
    search.optimize(s, SPACE, planted, 2, seed=0)
    search.optimize(study(tmp_path), SPACE, planted, 4, seed=0)
    assert len(study(tmp_path).trials) == 4
    search.optimize(study(tmp_path), SPACE, planted, 3, seed=0)      # already 4: nothing more
    assert len(study(tmp_path).trials) == 4


def test_a_trial_whose_rule_set_fails_is_recorded_and_the_search_goes_on(tmp_path):
    def failing(trial, chosen):
        if trial.number == 1:
            raise RuleFileError("t.yaml:3: bad")
        return planted(trial, chosen)
    s = study(tmp_path)
    search.optimize(s, SPACE, failing, 3, seed=0)
    assert [t.state.name for t in s.trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert s.trials[1].user_attrs["error"] == "t.yaml:3: bad"


def test_a_study_of_other_settings_is_refused(tmp_path):
    study(tmp_path, identity={"seed": 0, "metric": "aopc"})
    with pytest.raises(InputError, match=r"was run with other settings \(metric differ\); .* --force"):
        study(tmp_path, identity={"seed": 0, "metric": "lodds"})


def test_without_optuna_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)         # import optuna raises ImportError(name="optuna")
    with pytest.raises(MissingDependency, match=r"pip install \"rulegraph\[tune\]\""):
        search.optuna()
