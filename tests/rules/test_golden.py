"""Golden rule assignments of every shipped transformer rule set on the tiny BERT and GPT-2.

For each model and rule set the golden file records, per node relevance reaches (in
graph order), the node's op and the rule it gets with its parameters (``describe()``),
but not the YAML line it came from (lines move when a rule file is edited; the rule a
node gets should not). A change to a rule file, to the matcher or to the exporter that
moves any node to another rule shows up as a readable diff of one of these files.

Regenerate after an intended change (then review the diff and commit it)::

    RULEGRAPH_REGOLD=1 .venv/bin/python -m pytest -q tests/rules/test_golden.py

With the switch set the tests rewrite the files and skip, saying so; without it they compare.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import rulegraph
import tiny

GOLDEN = Path(__file__).parent / "golden" / "assignments"
REGOLD = os.environ.get("RULEGRAPH_REGOLD", "") not in ("", "0")
RULE_SETS = sorted(rulegraph.shipped_rule_sets())          # the transformer rule sets
MODELS = {  # model name → the inputs its export takes
    "bert": ("input_ids", "attention_mask", "token_type_ids"),
    "gpt2": ("input_ids", "attention_mask"),
}


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """Each tiny model, freshly built (seed 0) and exported with the TorchScript exporter."""
    folder = tmp_path_factory.mktemp("golden")
    return {name: rulegraph.load(str(tiny.onnx(tiny.build(name), folder / f"{name}.onnx", names=names)))
            for name, names in MODELS.items()}


def assignments(graph, rules: str) -> dict:
    """What the golden file holds: per reached node, in graph order, its op and rule."""
    binding = rulegraph.RuleSet.load(rules).bind(graph)
    nodes = {}
    for node in binding.reached:
        a = binding.assignments.get(node.name)
        nodes[node.name] = {"op": node.op, "rule": a.rule.describe() if a is not None else None}
    return {"rules": rules, "exporter": "torchscript", "reached": len(nodes),
            "unmatched": [n.name for n in binding.unmatched], "nodes": nodes}


def dump(data: dict) -> str:
    """JSON with one line per node, so a diff names exactly the nodes whose rule changed."""
    head = {k: v for k, v in data.items() if k != "nodes"}
    lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()] + ['  "nodes": {']
    items = [f"    {json.dumps(name)}: {json.dumps(entry)}" for name, entry in data["nodes"].items()]
    lines += [",\n".join(items), "  }", "}"]
    return "\n".join(lines) + "\n"


def golden_path(model: str, rules: str) -> Path:
    return GOLDEN / model / f"{rules}.json"


def test_golden_files_cover_exactly_the_shipped_rule_sets():
    """A new shipped rule set needs its golden files; a removed one leaves none behind."""
    if REGOLD:
        pytest.skip("RULEGRAPH_REGOLD set: golden files are being rewritten")
    for model in MODELS:
        found = sorted(p.stem for p in (GOLDEN / model).glob("*.json"))
        assert found == RULE_SETS, f"tests/golden/assignments/{model}/ does not match the shipped rule sets"


def test_dump_round_trips():
    data = {"rules": "x", "exporter": "torchscript", "reached": 2, "unmatched": [],
            "nodes": {"/b": {"op": "Add", "rule": "gradient(detach=[])"}, "/a": {"op": "MatMul", "rule": "route"}}}
    text = dump(data)
    assert json.loads(text) == data
    assert list(json.loads(text)["nodes"]) == ["/b", "/a"]        # order kept as written (graph order)
    assert text.count("\n") == 1 + 4 + 1 + 2 + 2                          # one line per node


@pytest.mark.parametrize("rules", RULE_SETS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_rule_assignments_match_the_golden_file(graphs, model, rules):
    got = assignments(graphs[model], rules)
    path = golden_path(model, rules)
    if REGOLD:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump(got))
        pytest.skip(f"RULEGRAPH_REGOLD set: rewrote {path.relative_to(Path(__file__).parents[2])}")
    assert path.exists(), (f"no golden file {path}; generate it with "
                           "RULEGRAPH_REGOLD=1 .venv/bin/python -m pytest tests/rules/test_golden.py")
    expected = json.loads(path.read_text())
    assert got["unmatched"] == [] and expected["unmatched"] == []
    assert got["reached"] == expected["reached"] == len(expected["nodes"])
    # node by node first, so the failure names the first node that moved
    for name, entry in expected["nodes"].items():
        assert name in got["nodes"], f"{model}/{rules}: node {name} is no longer reached"
        assert got["nodes"][name] == entry, f"{model}/{rules}: node {name}"
    assert list(got["nodes"]) == list(expected["nodes"])          # same nodes, same graph order
    assert got == expected


ROUTING = {"Reshape", "Transpose", "Gather", "Split", "Flatten", "Cast", "Slice", "Concat", "Squeeze", "Unsqueeze"}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_assignments_do_what_the_readme_table_says(graphs, model):
    """Independent of the golden files (so a regenerated golden cannot hide it): the rule each
    kind of node gets under each shipped set, as the README's table describes the sets."""
    got = {r: assignments(graphs[model], r)["nodes"] for r in RULE_SETS}
    blocks = tiny.SIZE["layers"]

    def rules_of(rules, op):
        return [e["rule"] for e in got[rules].values() if e["op"] == op]

    for name, e in got["gi"].items():                       # GI: the gradient rule, routing passes
        assert e["rule"] == ("route" if e["op"] in ROUTING else "gradient(detach=[])"), name
    for rules in ("lrp-ah", "lrp-ah-ln", "epsilon", "cp-lrp"):
        ah = [n for n, e in got[rules].items() if e["rule"].startswith("ah")]
        assert len(ah) == blocks, rules                      # one probabilities × values product per block
        assert all(got[rules][n] == {"op": "MatMul", "rule": "ah(probs=0)"} for n in ah), rules
        assert all(n.endswith("MatMul_1") for n in ah), ah   # the second attention MatMul: P·V, not Q·Kᵀ
        assert not rules_of(rules, "Softmax"), rules         # probabilities held: relevance never reaches them
    for rules in ("lrp-ah-ln", "epsilon", "attnlrp", "cp-lrp"):
        assert rules_of(rules, "LayerNormalization") == ["ln"] * (2 * blocks + 1), rules
    for rules in ("gi", "lrp-ah"):
        assert set(rules_of(rules, "LayerNormalization")) == {"gradient(detach=[])"}, rules
    assert rules_of("attnlrp", "Softmax") == ["softmax"] * blocks
    assert set(rules_of("epsilon", "Gemm")) == {"epsilon(detach=[], epsilon=1e-06, bias=True)"}
    assert {e["rule"].split("(")[0] for e in got["decomposition"].values()} <= {
        "linear", "layernorm", "activation", "product"}
    for rules in RULE_SETS:                                 # every set reaches the classifier and the pooling Gather
        names = list(got[rules])
        assert names[-1] == list(got["gi"])[-1], rules
        assert sum(got[rules][n]["op"] == "Gather" for n in names) == 1, rules     # [CLS] / last token
