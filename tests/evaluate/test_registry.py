"""The metric registry: every metric declares what the command line, the runner and the plots
read, the command line exposes every declared option, and the default set is the declared one."""
from __future__ import annotations

import dataclasses

import pytest

from rulegraph.cli.evaluate import evaluate_cmd
from rulegraph.errors import InputError
from rulegraph.evaluate import metrics as M

ALL = ["aopc", "lodds", "auac", "au-mse", "hiding", "revealing", "word-deletion", "precision@k", "logprob-drop",
       "morf-lerf"]


def test_registration_order_is_the_import_list():
    assert M.METRICS.names() == ALL


@pytest.mark.parametrize("name", ALL)
def test_every_metric_declares_name_direction_title_and_options(name):
    cls = M.METRICS.get(name)
    assert cls.name == name
    assert cls.direction() in ("↑", "↓")
    assert isinstance(cls.default, bool)
    assert cls.title and cls.title.strip() == cls.title
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for o in cls.options:
        assert o.help and o.type in (int, float) and o.name.isidentifier()
        assert o.attribute in fields and fields[o.attribute].default == o.default      # the field's default is the declared one
        assert (o.low is None or o.default >= o.low) and (o.high is None or o.default <= o.high)
    assert cls.from_settings(M.Removal(), M.settings()).name == name


def test_the_command_line_exposes_every_metric_option_with_its_default():
    options = {p.name: p for p in evaluate_cmd.params}
    for key, o in M.all_options().items():
        assert key in options, key
        assert o.flag in options[key].opts and options[key].default == o.default
    # the options of before the registry, by name and default
    assert {k: options[k].default for k in ("aopc_k", "aopc_step", "lodds_k", "steps", "words", "precision_k")} == \
        {"aopc_k": 20, "aopc_step": 1, "lodds_k": 20, "steps": 20, "words": 10, "precision_k": 20}


def test_the_default_set_is_the_metrics_declared_default_on():
    assert M.defaults() == [n for n, cls in M.METRICS.items() if cls.default]
    # precision@k needs an answer span, logprob-drop is for language models, morf-lerf is a protocol's
    # (achtibat2024): off by default
    assert M.defaults() == ALL[:-3]
    options = {p.name: p for p in evaluate_cmd.params}
    # unset: the protocol's metrics, else the defaults (the help says which)
    assert options["metric_names"].default is None and ",".join(M.defaults()) in options["metric_names"].help


def test_a_metric_name_twice_is_refused_and_unknown_names_list_the_choices():
    with pytest.raises(RuntimeError, match="registered twice"):
        M.metric("aopc")(type("Again", (M.Metric,), {}))
    with pytest.raises(InputError, match="unknown metric 'aopx'.*aopc"):
        M.METRICS.get("aopx")


def test_settings_are_checked_against_the_declared_ranges():
    with pytest.raises(InputError, match=r"--aopc-step must be in 1…100 \(got 0\)"):
        M.settings({"aopc_step": 0})
    with pytest.raises(InputError, match="unknown metric option 'aopc_kk'"):
        M.settings({"aopc_kk": 3})
    assert M.settings({"steps": "5"})["steps"] == 5
