"""Search spaces: parsed with file:line errors, sampled, and written as rule files that load."""
from __future__ import annotations

import re

import pytest
import torch
import yaml

from rulegraph.errors import InputError, RuleFileError
from rulegraph.rules import shipped_rule_sets, shipped_spaces
from rulegraph.ruleset import RuleSet
from rulegraph.tune import space as S

SPACE = """\
name: test
space:
  - id: linear
    op: Add
    inputs:
      1: {from: constant}
    choose:
      epsilon: {epsilon: {log: [1.0e-9, 1.0]}}
      gradient: {}
  - id: conv
    op: Conv
    choose:
      gamma: {gamma: {uniform: [0.0, 1.0]}}
      zplus: {}
    per_layer:
      - {blocks: "0-1", params: {gamma: {choice: [0.5, 1.0]}}}
  - op: Softmax
    choose:
      softmax: {}
      stop: {}
"""


class Fixed:
    """A stand-in for an Optuna trial: the first choice, the low end of every range (or ``values``)."""

    def __init__(self, **values):
        self.values, self.asked = values, []

    def suggest_categorical(self, name, choices):
        self.asked.append(name)
        return self.values.get(name, choices[0])

    def suggest_int(self, name, low, high):
        self.asked.append(name)
        return self.values.get(name, low)

    def suggest_float(self, name, low, high, *, log=False):
        self.asked.append(name)
        return self.values.get(name, low)


def test_a_space_parses_with_ids_kinds_and_per_layer_items():
    space = S.parse(SPACE, "s.yaml")
    assert [i.id for i in space.items] == ["linear", "conv", "e2"]
    assert [i.line for i in space.items] == [3, 10, 17]
    assert space.items[0].choose["epsilon"]["epsilon"] == S.Param("epsilon", "log", (1e-9, 1.0))
    assert space.items[1].layers[0].where == {"blocks": "0-1"}
    assert space.names() == ["linear.rule", "linear.epsilon.epsilon", "conv.rule", "conv.gamma.gamma",
                             "conv.layer0.gamma", "e2.rule"]


@pytest.mark.parametrize("shipped", sorted(shipped_spaces()))
def test_the_shipped_spaces_parse_and_each_choice_loads_with_their_rule_sets(shipped):
    """Every space in rulegraph/rules/spaces/ (``--space NAME``), the defaults among them."""
    space = S.load(S.space_path(shipped))
    assert S.default_space(space.models) == str(shipped_spaces()[space.models])
    for name, path in shipped_rule_sets(space.models).items():
        if RuleSet.load(name).pass_name != space.pass_name:     # decomposition: refused by rulegraph tune
            continue
        text = space.at_depth(6).rule_text(path.read_text(), space.sample(Fixed()), name="t", description="d")
        assert RuleSet.from_yaml(text, source=name).entries


# (space text with one mistake, the line named, words the message holds)
MISTAKES = [
    (SPACE.replace("    op: Conv\n", "    op: Convv\n"), 11, "'Convv' is neither an op"),
    (SPACE.replace("      zplus: {}", "      zplusx: {}"), 14, "unknown rule 'zplusx'"),
    (SPACE.replace("{gamma: {uniform: [0.0, 1.0]}}", "{gama: {uniform: [0.0, 1.0]}}"), 13, "no param 'gama'"),
    (SPACE.replace("{uniform: [0.0, 1.0]}", "{uniform: [1.0, 0.0]}"), 13, "is empty; low must be under high"),
    (SPACE.replace("{log: [1.0e-9, 1.0]}", "{log: [0.0, 1.0]}"), 8, "needs low > 0"),
    (SPACE.replace("{uniform: [0.0, 1.0]}", "{uniform: [-1.0, 1.0]}"), 13, "param 'gamma' of rule 'gamma'"),
    (SPACE.replace("{uniform: [0.0, 1.0]}", "{normal: [0.0, 1.0]}"), 13, "a param range is one of"),
    (SPACE.replace("  - id: conv\n", "  - id: linear\n"), 10, "id 'linear' is already the id of the entry on line 3"),
    (SPACE.replace("    choose:\n      softmax", "    chose:\n      softmax"), 18, "unknown key 'chose'"),
    (SPACE.replace("  - op: Softmax\n", "  - note: no selector\n"), 17, "needs a selector"),
    (SPACE.replace('{blocks: "0-1", ', '{blocks: "3-1", '), 16, "empty block range"),
    (SPACE.replace('{blocks: "0-1", ', '{depth: "50%", '), 16, "depth must be a range of percent"),
    (SPACE.replace('{blocks: "0-1", ', '{depth: "60-40%", '), 16, "depth must be a range of percent"),
    (SPACE.replace('{blocks: "0-1", ', '{blocks: "0-1", depth: "0-50%", '), 16, "give `blocks:` or `depth:`"),
    (SPACE.replace("{choice: [0.5, 1.0]}", "{choice: [0.5, x]}"), 16, "must be float"),
    (SPACE.replace("{gamma: {choice: [0.5, 1.0]}}", "{epsilon: 0.1}"), 16, "no candidate rule of this entry"),
    (SPACE.replace("      1: {from: constant}", "      1: {from: constnt}"), 6, "'constnt' is neither"),
    (SPACE.replace("space:\n", "spaces:\n"), 2, "unknown key 'spaces'"),
    ("name: x\n", 1, "missing `space:`"),
    ("space: [\n", 2, "not valid YAML"),
    ("space:\n  - !!python/object:os.system {op: Add}\n", 2, "tag"),
]


@pytest.mark.parametrize("text,line,words", MISTAKES, ids=[m[2][:30] for m in MISTAKES])
def test_a_mistake_names_the_file_and_line(text, line, words):
    with pytest.raises(RuleFileError) as info:
        S.parse(text, "s.yaml")
    message = str(info.value)
    assert re.match(rf"s\.yaml:{line}: ", message), message
    assert words in message, message
    assert "\n" not in message


def test_sampling_asks_each_entry_its_rule_then_that_rule_s_params():
    space = S.parse(SPACE, "s.yaml")
    trial = Fixed(**{"linear.epsilon.epsilon": 1.23456789e-4, "conv.rule": "zplus"})
    chosen = space.sample(trial)
    assert chosen["linear"] == {"rule": "epsilon", "params": {"epsilon": 1.235e-4}, "layers": []}   # 4 digits
    # zplus declares no gamma: the per_layer item is not asked and not written
    assert chosen["conv"] == {"rule": "zplus", "params": {}, "layers": []}
    assert "conv.layer0.gamma" not in trial.asked and "conv.gamma.gamma" not in trial.asked
    chosen = space.sample(Fixed(**{"conv.gamma.gamma": 0.3}))
    assert chosen["conv"] == {"rule": "gamma", "params": {"gamma": 0.3}, "layers": [{"blocks": "0-1",
                                                                                      "params": {"gamma": 0.5}}]}


def test_zero_or_log_samples_zero_or_a_log_uniform_value_and_names_both_choices():
    space = S.parse("space:\n  - id: d\n    op: MatMul\n    choose:\n      gradient: {}\n"
                    "      gamma: {gamma: {zero-or-log: [1.0e-3, 1.0]}}\n    per_layer:\n"
                    "      - {blocks: 0, params: {gamma: {zero-or-log: [1.0e-2, 1.0]}}}\n", "z.yaml")
    assert space.names() == ["d.rule", "d.gamma.gamma.zero", "d.gamma.gamma", "d.layer0.gamma.zero", "d.layer0.gamma"]
    zero = Fixed(**{"d.rule": "gamma"})                  # the first choice of `.zero` is True: γ = 0 (LRP-0)
    assert space.sample(zero)["d"] == {"rule": "gamma", "params": {"gamma": 0.0},
                                       "layers": [{"blocks": 0, "params": {"gamma": 0.0}}]}
    assert "d.gamma.gamma" not in zero.asked              # no γ is sampled where it is 0
    some = Fixed(**{"d.rule": "gamma", "d.gamma.gamma.zero": False, "d.gamma.gamma": 0.123456,
                    "d.layer0.gamma.zero": False})
    assert space.sample(some)["d"] == {"rule": "gamma", "params": {"gamma": 0.1235},
                                       "layers": [{"blocks": 0, "params": {"gamma": 0.01}}]}
    with pytest.raises(RuleFileError, match=r"z.yaml:4: zero-or-log: \[0.0, 1.0\] needs low > 0"):
        S.parse("space:\n  - op: MatMul\n    choose:\n      gamma: {gamma: {zero-or-log: [0.0, 1.0]}}\n", "z.yaml")


def test_the_rule_file_overrides_the_starting_entry_in_place_and_puts_new_selectors_first():
    start = shipped_rule_sets(None)["epsilon"].read_text()
    space = S.parse(SPACE, "s.yaml")
    chosen = space.sample(Fixed(**{"linear.epsilon.epsilon": 1e-7}))
    text = space.rule_text(start, chosen, name="epsilon-tuned", description="d", header="line one\nline two")
    assert text.startswith("# line one\n# line two\nname: epsilon-tuned\n")
    doc, before = yaml.safe_load(text), yaml.safe_load(start)
    # Conv and Softmax are in no entry of epsilon: first; the Add-constant-at-1 entry replaced where it was
    assert doc["rules"][0] == {"op": "Conv", "rule": "gamma", "params": {"gamma": 0.0},
                               "per_layer": [{"blocks": "0-1", "params": {"gamma": 0.5}}]}
    assert doc["rules"][1] == {"op": "Softmax", "rule": "softmax"}
    at = next(k for k, e in enumerate(before["rules"]) if e.get("inputs") == {1: {"from": "constant"}})
    assert doc["rules"][2 + at] == {"op": "Add", "inputs": {1: {"from": "constant"}}, "rule": "epsilon",
                                    "params": {"epsilon": 1e-7}}
    assert len(doc["rules"]) == len(before["rules"]) + 2
    assert {k: v for k, v in doc.items() if k not in ("name", "description", "rules")} == \
        {k: v for k, v in before.items() if k not in ("name", "description", "rules")}
    rs = RuleSet.from_yaml(text)
    assert rs.name == "epsilon-tuned"
    assert rs.entries[2 + at].rule.epsilon == 1e-7        # read back as a float, not the string "1e-07"


def test_conserving_keeps_rules_that_can_conserve_and_refuses_an_entry_left_with_none():
    with pytest.raises(RuleFileError, match=r"^s\.yaml:17: entry 'e2' offers no rule that conserves \(softmax, stop\)"):
        S.parse(SPACE, "s.yaml").conserving()
    text = SPACE.replace("      stop: {}", "      identity: {}")
    space = S.parse(text, "s.yaml").conserving()
    # gradient and epsilon conserve where the node is affine (their own test), gamma, zplus, identity always
    assert [list(i.choose) for i in space.items] == [["epsilon", "gradient"], ["gamma", "zplus"], ["identity"]]


@pytest.mark.parametrize("conv", ["gamma", "alphabeta", "zplus"])
def test_each_conv_choice_of_the_cnn_space_keeps_the_first_conv_s_zbox_and_conserves(conv, tmp_path):
    import cnn
    import rulegraph
    x = cnn.image(2, 8)
    path = cnn.onnx(cnn.build("resnet"), tmp_path / "resnet.onnx", x)
    space = S.load(S.default_space("cnns"))
    values = {"conv.rule": conv, "conv.gamma.gamma": 0.1, "dense.epsilon.epsilon": 1e-3, "pool.epsilon.epsilon": 1e-5}
    text = space.rule_text(shipped_rule_sets("cnns")["epsilon-gamma-box"].read_text(), space.sample(Fixed(**values)),
                           name="t", description="d")
    rs = RuleSet.from_yaml(text)
    binding = rs.bind(rulegraph.load(str(path)))
    assert not binding.unmatched
    convs = [binding.assignments[n.name].rule for n in binding.reached if n.op == "Conv"]
    assert convs[0].name == "zbox" and {r.name for r in convs[1:]} == {conv}
    e = rulegraph.explain(str(path), rs, {"pixel_values": x}, dtype=torch.float64)
    c = e.audit.conservation
    assert not e.audit.unexpected and c.breaks == 0.0
    assert abs(c.residual) <= 1e-10 * abs(c.output_value)


def test_the_transformer_space_s_first_choices_conserve_on_a_tiny_bert(bert_onnx):
    import rulegraph
    space = S.load(S.default_space("transformers"))
    chosen = space.sample(Fixed(**{"linear.epsilon.epsilon": 1e-6}))
    assert {k: c["rule"] for k, c in chosen.items()} == {"linear": "epsilon", "attention": "ah", "softmax": "softmax",
                                                         "norm": "ln", "activation": "identity"}
    for start in ("epsilon", "cp-lrp", "attnlrp"):
        text = space.rule_text(shipped_rule_sets(None)[start].read_text(), chosen, name="t", description="d")
        e = rulegraph.explain(str(bert_onnx), RuleSet.from_yaml(text, source=start), text="w1 w2 w3 w4",
                              dtype=torch.float64)
        audit = e.audit
        assert not audit.unexpected, (start, [n.name for n in audit.unexpected])
        assert audit.conservation.breaks == 0.0, start       # every rule conserves: the softmax gets nothing
        assert abs(audit.conservation.residual) <= 1e-8 * abs(audit.conservation.output_value), start


def test_a_space_is_a_file_or_a_shipped_name_and_anything_else_is_refused_naming_them(tmp_path):
    assert set(shipped_spaces()) >= {"cnns", "transformers", "transformers-dense"}
    assert S.space_path("transformers-dense").endswith("transformers-dense.yaml")
    given = tmp_path / "mine.yaml"
    given.write_text(SPACE)
    assert S.space_path(str(given)) == str(given)
    with pytest.raises(InputError, match="--space file not found: transformer; shipped spaces: cnns, transformers, "):
        S.space_path("transformer")
    with pytest.raises(InputError, match="is a directory"):
        S.space_path(str(tmp_path))


@pytest.mark.parametrize("blocks, lower, upper", [(6, "0-2", "3-5"), (5, "0-1", "2-4"), (12, "0-5", "6-11"),
                                                  (2, "0-0", "1-1")])
def test_a_depth_range_is_written_as_the_blocks_of_the_model_tuned(blocks, lower, upper):
    """``depth: "0-50%"`` / ``"50-100%"``: the halves of any model (the middle block of an odd count above)."""
    space = S.parse(SPACE.replace('{blocks: "0-1", ', '{depth: "0-50%", ').replace(
        "    per_layer:\n", '    per_layer:\n      - {depth: "50-100%", params: {gamma: {choice: [0.5]}}}\n'),
        "s.yaml")
    where = [layer.where for layer in space.at_depth(blocks).items[1].layers]
    assert where == [{"blocks": upper}, {"blocks": lower}]


def test_the_halves_hold_every_block_once_at_any_depth():
    for n in range(2, 40):
        assert S.depth_blocks("0-50%", n) + S.depth_blocks("50-100%", n) == list(range(n))
        assert S.depth_blocks("0-100%", n) == list(range(n))


def test_a_depth_that_holds_no_block_of_the_model_is_refused_naming_the_line():
    space = S.parse(SPACE.replace('{blocks: "0-1", ', '{depth: "0-20%", '), "s.yaml")
    with pytest.raises(InputError, match=r"s\.yaml:16: depth '0-20%' holds no block: the model has 2 block\(s\)"):
        space.at_depth(2)
    with pytest.raises(InputError, match="the model numbers no transformer blocks"):
        space.at_depth(0)


def test_an_entry_whose_choices_bind_no_other_rule_is_named_inert(bert_onnx, causal_lm):
    """The BERT has bias additions (the bias first: `any` input), a softmax the uniform rule reaches, norms
    and activations: every entry of the shipped space moves a rule; GPT-2 has its biases in Gemm nodes, and
    its tanh GELU is a gate an earlier entry of cp-lrp holds (the activation's rule never applies). A
    Llama-style decoder has no biases, its RMSNorm is no `normalization` op (its factor is held by an
    earlier entry) and its SiLU gate is a product an earlier entry takes; an op the model lacks is inert."""
    from rulegraph.loaders import load
    cp_lrp = shipped_rule_sets(None)["cp-lrp"].read_text()
    space = S.load(S.default_space("transformers"))
    bert = load(str(bert_onnx))
    assert space.inert(bert, cp_lrp) == []
    extra = S.parse("space:\n  - id: conv\n    op: Conv\n    choose:\n      gamma: {gamma: {log: [1.0e-3, 1.0]}}\n"
                    "  - id: dense\n    op: MatMul\n    inputs: {1: {from: constant}}\n    choose:\n"
                    "      gradient: {}\n      gamma: {gamma: 0.25}\n")
    assert extra.inert(bert, cp_lrp) == [("conv.gamma.gamma", 2)]
    module, path = causal_lm
    lm = load(str(path))
    names = [name for name, _ in space.inert(lm, cp_lrp)]
    assert names == (["activation.rule"] if module.config.model_type == "gpt2" else
                     ["linear.epsilon.epsilon", "norm.rule", "activation.rule"])


def test_a_zero_or_log_parameter_is_one_panel_of_the_trials_plot(tmp_path):
    from rulegraph.tune.plots import panels, trials_plot
    names = ["d.rule", "d.gamma.gamma.zero", "d.gamma.gamma", "d.layer0.gamma.zero", "d.layer0.gamma"]
    done = [{"state": "complete", "value": 0.4, "param.d.rule": "gradient"},
            {"state": "complete", "value": 0.5, "param.d.rule": "gamma", "param.d.gamma.gamma.zero": True,
             "param.d.layer0.gamma.zero": False, "param.d.layer0.gamma": 0.02},
            {"state": "complete", "value": 0.3, "param.d.rule": "gamma", "param.d.gamma.gamma.zero": False,
             "param.d.gamma.gamma": 0.5, "param.d.layer0.gamma.zero": True}]
    assert panels(done, names) == ["d.rule", "d.gamma.gamma", "d.layer0.gamma"]
    assert panels(done[:1], names) == ["d.rule"]
    assert trials_plot(done, names, "aopc", tmp_path / "t.png").stat().st_size > 0
