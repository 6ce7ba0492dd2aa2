"""Rule files: schema errors point at file:line with the valid choices; matching is first-wins."""
from __future__ import annotations

import pytest

import rulegraph
from rulegraph import RuleSet
from rulegraph.errors import RuleFileError, RuleMatchError
from rulegraph.experts import ROUTING
from rulegraph.patterns import PATTERNS, PROBABILITIES


def error(text: str) -> str:
    with pytest.raises(RuleFileError) as info:
        RuleSet.from_yaml(text, source="my.yaml")
    return str(info.value)


@pytest.mark.parametrize("text, expected", [
    ("", "my.yaml:1: the rule file is empty"),
    ("rules: [\n  - op: X\n", "my.yaml:2: not valid YAML"),
    ("name: x\n", "my.yaml:1: missing `rules:`"),
    ("rules: []\n", "my.yaml:1: `rules:` must be a non-empty list"),
    ("rulez:\n  - op: Add\n", "my.yaml:1: unknown key 'rulez' in the rule file; did you mean 'rules'?"),
    ("rules:\n  - op: Add\n", "my.yaml:2: rule entry has no `rule:`; valid: ah, alphabeta, epsilon"),
    ("rules:\n  - op: Add\n    rule: epsilom\n", "my.yaml:3: unknown rule 'epsilom'; did you mean 'epsilon'?"),
    ("rules:\n  - op: Add\n    rule: gradient\n    param: {}\n",
     "my.yaml:4: unknown key 'param' in a rule entry; did you mean 'params'?"),
    ("rules:\n  - op: Add\n    rule: epsilon\n    params:\n      epsilonn: 0.1\n",
     "my.yaml:5: rule 'epsilon' has no param 'epsilonn'; did you mean 'epsilon'?"),
    ("rules:\n  - op: Add\n    rule: epsilon\n    params: {epsilon: lots}\n",
     "my.yaml:4: param 'epsilon' must be float, got 'lots'"),
    ("rules:\n  - op: Add\n    rule: stop\n    params: {x: 1}\n", "my.yaml:4: rule 'stop' has no param 'x'; it takes no params"),
    ("rules:\n  - op: Add\n    rule: gradient\n    params: {detach: [one]}\n", "my.yaml:4: param 'detach' must be"),
    ("on_unmatched: ignore\nrules:\n  - op: Add\n    rule: route\n", "my.yaml:1: on_unmatched must be error, warn"),
    ("boundary: embedding\nrules:\n  - op: Add\n    rule: route\n",
     "my.yaml:1: unknown boundary 'embedding'; did you mean 'embeddings'?"),
    ("rules:\n  - op: MatMul\n    inputs: {zero: {from: Softmax}}\n    rule: ah\n",
     "my.yaml:3: input position must be an integer or `any` (some input), got 'zero'"),
    ("rules:\n  - op: MatMul\n    inputs:\n      0: {form: Softmax}\n    rule: ah\n",
     "my.yaml:4: unknown key 'form' in the pattern for input 0; did you mean 'from'?"),
    ("rules:\n  - op: {a: 1}\n    rule: ah\n", "my.yaml:2: op must be a string or a list of strings"),
    ("rules:\n  - op: [MatMul, Sofmax]\n    rule: ah\n",
     "my.yaml:2: op: 'Sofmax' is neither an op rulegraph implements nor one of *; did you mean 'Softmax'"),
    ("rules:\n  - op: MatMul\n    inputs:\n      0: {from: Softmx}\n    rule: ah\n",
     "my.yaml:4: from: 'Softmx' is neither an op rulegraph implements nor one of input, constant, *, routing"),
    ("rules:\n  - op: MatMul\n    inputs:\n      0: {from: Softmax, through: routin}\n    rule: ah\n",
     "my.yaml:4: through: 'routin' is neither an op rulegraph implements nor one of routing, elementwise, "
     "activation, sigmoidal, normalization, arithmetic; did you mean 'routing'"),
    ("rules:\n  - trait: activations\n    rule: identity\n",
     "my.yaml:2: unknown op trait 'activations'; did you mean 'activation'"),
    ("name: x\nno_canonize: [quantisation]\nrules:\n  - op: Add\n    rule: route\n",
     "my.yaml:2: no_canonize: 'quantisation' is not a canonizer applied by default (only those can be turned off; "
     "the others apply only where `canonize:` lists them); did you mean 'quantization'"),
    ("no_canonize: batchnorm\nrules:\n  - op: Add\n    rule: route\n",
     "my.yaml:1: no_canonize: 'batchnorm' is not a canonizer applied by default"),
    ("canonize: [quantization]\nno_canonize: [quantization]\nrules:\n  - op: Add\n    rule: route\n",
     "my.yaml:2: canonizer 'quantization' is both in `canonize:` and in `no_canonize:`"),
    ("no_canonize: {quantization: false}\nrules:\n  - op: Add\n    rule: route\n",
     "my.yaml:1: no_canonize must be a string or a list of strings"),
    ("rules:\n  - op: MatMul\n    inputs:\n      0: {from: attention-probs}\n    rule: ah\n",
     "my.yaml:4: from: 'attention-probs' is neither an op rulegraph implements nor one of input, constant, *, "
     "routing, elementwise, activation, sigmoidal, normalization, arithmetic, attention-probabilities, rms-factor, "
     "layernorm-std, activation-gate, selective-scan-kernel, moe-routing; did you mean 'attention-probabilities'"),
    ("rules:\n  - op: MatMul\n    inputs:\n      0: {from: [attention-probabilities, Softmax]}\n    rule: ah\n",
     "my.yaml:4: from: a named pattern (attention-probabilities, rms-factor, layernorm-std, activation-gate, "
     "selective-scan-kernel, moe-routing) stands alone: it says what it looks through; no other names, no `through:`"),
    ("rules:\n  - op: Mul\n    inputs:\n      1:\n        from: moe-routing\n        through: routing\n    rule: ah\n",
     "my.yaml:5: from: a named pattern"),
])
def test_rule_file_errors_name_line_and_choices(text, expected):
    assert error(text).startswith(expected)


def test_shipped_rule_sets_load_and_unknown_names_are_refused(tmp_path):
    assert {"gi", "lrp-ah", "lrp-ah-ln", "epsilon"} <= set(rulegraph.shipped_rule_sets())
    for name in rulegraph.shipped_rule_sets():
        assert RuleSet.load(name).entries
    with pytest.raises(RuleFileError, match="no rule set named 'lrp-ah-lm'; did you mean 'lrp-ah-ln'"):
        RuleSet.load("lrp-ah-lm")
    with pytest.raises(RuleFileError, match="rule file not found"):
        RuleSet.load(tmp_path / "missing.yaml")
    path = tmp_path / "mine.yaml"
    path.write_text("rules:\n  - op: '*'\n    rule: gradient\n    params: {detach: [1]}\n")
    assert RuleSet.load(path).entries[0].rule.detach == [1]


@pytest.mark.parametrize("head, applied", [
    ("", ("quantization",)),                                      # the default
    ("canonize: [batchnorm]\n", ("quantization", "batchnorm")),    # the default first, then the listed ones
    ("canonize: [quantization, batchnorm]\n", ("quantization", "batchnorm")),
    ("canonize: [batchnorm, quantization]\n", ("batchnorm", "quantization")),   # listed: where listed
    ("no_canonize: [quantization]\n", ()),
    ("no_canonize: quantization\ncanonize: [batchnorm]\n", ("batchnorm",)),
])
def test_the_quantization_canonizer_applies_unless_turned_off(head, applied):
    rs = RuleSet.from_yaml(f"{head}rules:\n  - op: '*'\n    rule: gradient\n", source="my.yaml")
    assert rs.canonize == applied
    given = [(e.ops, e.rule.name, e.where) for e in rs.canonizer_entries]
    assert given == ([(("QuantizeDequantize",), "quantization", "my.yaml: canonizer quantization")]
                     if "quantization" in applied else [])
    assert [e.rule.name for e in rs.entries] == ["gradient"]      # the file's entries, as written


def test_a_rule_file_naming_the_round_trip_gives_it_its_own_rule():
    rs = RuleSet.from_yaml("rules:\n  - op: QuantizeDequantize\n    rule: gradient\n  - op: '*'\n    rule: route\n")
    assert rs.canonize == ("quantization",) and rs.canonizer_entries == []


def test_the_decomposition_pass_gets_no_canonizer_entry():
    """The quantization canonizer names a rule for the relevance pass only; a decomposition rule file
    says what its round trips get."""
    rs = RuleSet.from_yaml("pass: decomposition\nrules:\n  - op: '*'\n    rule: linear\n")
    assert rs.canonize == ("quantization",) and rs.canonizer_entries == []


@pytest.mark.parametrize("name, pattern", [("attention-probabilities", PROBABILITIES), ("moe-routing", ROUTING)])
def test_a_named_pattern_is_the_one_the_code_reads_the_graph_with(name, pattern):
    """heads.py finds attention blocks with PROBABILITIES, experts.py MoE blocks with ROUTING: the rule
    files name the same objects."""
    rs = RuleSet.from_yaml(f"rules:\n  - op: Mul\n    inputs:\n      1: {{from: {name}}}\n    rule: ah\n")
    assert rs.entries[0].inputs[1] is pattern


def test_the_shipped_rule_files_name_the_patterns_they_do_not_spell_out():
    """No shipped entry writes out a copy of a named pattern (op types and through lists): it names it."""
    for name in rulegraph.shipped_rule_sets(None):
        for entry in RuleSet.load(name).entries:
            for pattern in entry.inputs.values():
                copies = [n for n, p in PATTERNS.items() if p == pattern and p is not pattern]
                assert not copies, f"rules/{name}.yaml:{entry.line} spells out the pattern {copies[0]}"


def test_first_match_wins_and_patterns_look_through(bert_onnx, bert_sdpa_onnx):
    text = """
rules:
  - op: MatMul
    inputs:
      0: {from: Softmax, through: [Where]}
    rule: ah
  - name: "*/attention/output/dense/Add"
    rule: epsilon
  - op: Add
    inputs:
      0: {from: constant}
    rule: zero
  - op: "*"
    rule: gradient
"""
    rules = RuleSet.from_yaml(text, source="m.yaml")
    for path in (bert_onnx, bert_sdpa_onnx):
        graph = rulegraph.load(path)
        binding = rules.bind(graph)
        by_rule = {}
        for node in binding.reached:
            by_rule.setdefault(binding.assignments[node.name].where, []).append(node)
        assert len(by_rule["m.yaml:3"]) == 2 and all(n.op == "MatMul" for n in by_rule["m.yaml:3"])
        assert all(n.name.endswith("attention/output/dense/Add") for n in by_rule["m.yaml:7"])
        assert len(by_rule["m.yaml:7"]) == 2          # the name glob came first, not the bias entry
        assert all(n.op == "Add" for n in by_rule["m.yaml:9"])


def test_any_input_matches_a_constant_at_either_position(bert_onnx):
    """The exported BERT adds each bias first (Add(b, x·W)) and GELU's 1 second (Add(erf(·), 1)): `any:` finds
    both kinds, and the bias additions still with their inputs swapped."""
    import onnx
    from onnx import helper
    graph = rulegraph.load(bert_onnx)

    def matched(key: str, g=graph) -> list[str]:
        rules = RuleSet.from_yaml(f"rules:\n  - op: Add\n    inputs:\n      {key}: {{from: constant}}\n    rule: zero\n"
                                  "  - op: '*'\n    rule: gradient\n", source="m.yaml")
        binding = rules.bind(g)
        return [n.name for n in binding.reached if binding.assignments[n.name].where == "m.yaml:2"]
    first, second, anywhere = matched("0"), matched("1"), matched("any")
    assert first and second and not set(first) & set(second) and sorted(anywhere) == sorted(first + second)
    model = onnx.load(str(bert_onnx))
    for node in model.graph.node:
        if node.name in first:
            node.input[0], node.input[1] = node.input[1], node.input[0]
    swapped = rulegraph.load(model)
    assert matched("any", swapped) == anywhere and sorted(matched("1", swapped)) == sorted(first + second)
    assert matched("0", swapped) == []


def test_rule_that_cannot_apply_names_the_line_and_the_node(bert_onnx):
    rules = RuleSet.from_yaml("rules:\n  - op: MatMul\n    rule: ln\n  - op: '*'\n    rule: gradient\n", source="x.yaml")
    with pytest.raises(RuleMatchError, match=r"x.yaml:2: rule 'ln' cannot apply to node '.*MatMul' \(op MatMul\): "
                                             r"it applies to LayerNormalization"):
        rules.bind(rulegraph.load(bert_onnx)).require_complete()
    rules = RuleSet.from_yaml("rules:\n  - op: Add\n    rule: route\n  - op: '*'\n    rule: gradient\n", source="y.yaml")
    binding = rules.bind(rulegraph.load(bert_onnx))
    assert len(binding.problems) > 1 and all("y.yaml:2: rule 'route' cannot apply" in str(p) for p in binding.problems)
    with pytest.raises(RuleMatchError, match="y.yaml:2: rule 'route' cannot apply .* only to routing ops.*more problem"):
        binding.require_complete()


def test_only_nodes_relevance_reaches_need_rules(bert_onnx):
    """Under the AH rule nothing reaches queries, keys or the softmax: they need no rule."""
    graph = rulegraph.load(bert_onnx)
    binding = RuleSet.load("lrp-ah-ln").bind(graph)
    reached_ops = {n.op for n in binding.reached}
    assert "Softmax" not in reached_ops and not binding.unmatched
    gi = RuleSet.load("gi").bind(graph)
    assert "Softmax" in {n.op for n in gi.reached}


def test_boundary_choices(bert_onnx):
    graph = rulegraph.load(bert_onnx)
    default = RuleSet.load("gi").bind(graph)
    assert set(default.boundary.values()) == {"input_ids", "token_type_ids"}
    nodes = RuleSet.from_yaml("boundary: {nodes: ['*embeddings/LayerNorm*']}\nrules:\n  - op: '*'\n    rule: gradient\n")
    binding = nodes.bind(graph)
    assert len(binding.boundary) == 1 and "LayerNorm" in next(iter(binding.boundary.values()))
    missing = RuleSet.from_yaml("boundary: {nodes: ['nothing*']}\nrules:\n  - op: '*'\n    rule: gradient\n")
    with pytest.raises(RuleMatchError, match="match no node"):
        missing.bind(graph)
    inputs = RuleSet.from_yaml("boundary: inputs\nrules:\n  - op: '*'\n    rule: gradient\n")
    with pytest.raises(RuleMatchError, match="no relevance boundary"):
        inputs.bind(graph)


def test_on_unmatched_can_name_a_fallback_rule(bert_onnx):
    rules = RuleSet.from_yaml("on_unmatched: gradient\nrules:\n  - op: Tanh\n    rule: identity\n", source="f.yaml")
    binding = rules.bind(rulegraph.load(bert_onnx))
    assert not binding.unmatched
    wheres = {a.where for a in binding.assignments.values()}
    assert wheres == {"f.yaml:3", "f.yaml: on_unmatched"}


def test_loading_the_same_file_twice_gives_the_same_rule_set(tmp_path):
    """explain(graph, "name") binds once per rule set object: a reload must not make a new one."""
    assert RuleSet.load("lrp-ah-ln") is RuleSet.load("lrp-ah-ln")
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nrules:\n  - op: '*'\n    rule: gradient\n")
    first = RuleSet.load(path)
    assert RuleSet.load(str(path)) is first
    path.write_text("name: mine\nrules:\n  - op: '*'\n    rule: zero\n")
    changed = RuleSet.load(path)
    assert changed is not first and changed.entries[0].rule.name == "zero"


# -- op traits, param domains, what a rule file may expand to -------------------------------------------

def test_trait_routing_selects_exactly_the_routing_ops(bert_onnx):
    from rulegraph.ops import lookup
    graph = rulegraph.load(bert_onnx)
    rules = RuleSet.from_yaml("rules:\n  - trait: routing\n    rule: route\n  - op: '*'\n    rule: gradient\n",
                              source="t.yaml")
    binding = rules.bind(graph)
    for node in binding.reached:
        routing = lookup(node.op, node.domain).routing
        assert (binding.assignments[node.name].rule.name == "route") == routing, node.op
    assert any(binding.assignments[n.name].rule.name == "route" for n in binding.reached)


@pytest.mark.parametrize("text, expected", [
    ("rules:\n  - trait: routeing\n    rule: route\n", "my.yaml:2: unknown op trait 'routeing'; did you mean 'routing'?"),
    ("rules:\n  - op: Add\n    rule: epsilon\n    params: {epsilon: -0.1}\n",
     "my.yaml:4: param 'epsilon' of rule 'epsilon' must be ≥ 0, got -0.1"),
    ("rules:\n  - op: Conv\n    rule: gamma\n    params:\n      gamma: -1\n",
     "my.yaml:5: param 'gamma' of rule 'gamma' must be ≥ 0, got -1.0"),
    ("rules:\n  - op: Conv\n    rule: zplus\n    params: {stabilizer: -1.0e-6}\n", "my.yaml:4: param 'stabilizer'"),
    ("pass: decomposition\nrules:\n  - op: Relu\n    rule: activation\n    params: {threshold: 2}\n",
     "my.yaml:5: param 'threshold' of rule 'activation' must be ≤ 1, got 2.0"),
    ("pass: backward\nrules:\n  - op: Add\n    rule: route\n", "my.yaml:1: unknown pass 'backward'"),
    ("rules:\n  - op: Add\n    rule: epsilon\n    params: {epsilon: !!python/object:os.system x}\n",
     "my.yaml:4: tag 'tag:yaml.org,2002:python/object:os.system' is not allowed in a rule file"),
])
def test_domains_traits_and_tags_are_checked_where_the_file_is_read(text, expected):
    assert expected in error(text)


def test_an_alias_bomb_is_refused_before_it_expands():
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = "\n".join(levels) + "\nrules:\n  - op: Add\n    rule: route\n    note: *a8\n"
    message = error(text)
    assert "expands to more than 100,000 YAML nodes" in message and message.startswith("my.yaml:")
    assert len(message) < 300


def test_a_renamed_rule_is_taken_with_a_warning_naming_the_line():
    """`pass` became `route` (one name, one meaning: a pass is relevance or decomposition)."""
    with pytest.warns(UserWarning, match=r"my.yaml:3: rule 'pass' is now 'route'"):
        rules = RuleSet.from_yaml("rules:\n  - trait: routing\n    rule: pass\n", source="my.yaml")
    assert rules.entries[0].rule.name == "route"


def test_a_binding_s_fingerprint_is_what_it_decides_not_the_text(bert_onnx):
    graph = rulegraph.load(bert_onnx)
    base = ("rules:\n  - op: MatMul\n    inputs:\n      0: {from: Softmax}\n    rule: ah\n"
            "  - op: '*'\n    rule: gradient\n")
    lacking = base.replace("rules:\n", "# another text\nrules:\n  - op: Conv\n    rule: zplus\n")
    other = base.replace("rule: gradient", "rule: epsilon")
    a, b, c = (RuleSet.from_yaml(t, source=f"{k}.yaml").bind(graph).fingerprint()
               for k, t in (("a", base), ("b", lacking), ("c", other)))
    assert a == b != c and len(a) == 64
