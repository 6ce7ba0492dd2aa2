"""`rulegraph check` fails whenever `explain` would for a reason it can see without inputs, and
names every gap at once: ops with no implementation, rules that cannot apply, nodes without a rule."""
from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from rulegraph.cli import main

GRADIENT = "rules:\n  - op: '*'\n    rule: gradient\n"
CASES = {
    "ok": (["Add", "Mul"], GRADIENT, 0),
    "no kernel": (["Tan", "Atan", "Add", "Mul"], GRADIENT, 1),
    "rule cannot apply": (["Add", "Mul"], "rules:\n  - op: Mul\n    rule: softmax\n  - op: Add\n    rule: ln\n"
                          "  - op: '*'\n    rule: gradient\n", 1),
    "no rule": (["Add", "Mul"], "rules:\n  - op: Add\n    rule: gradient\n", 1),
    "no rule, warn": (["Add", "Mul"], "on_unmatched: warn\nrules:\n  - op: Add\n    rule: gradient\n", 0),
}


def _model(path, ops):
    """x → ops[0](x) → … chained; two-input ops take x again."""
    nodes, value = [], "x"
    for i, op in enumerate(ops):
        inputs = [value, "x"] if op in ("Add", "Mul") else [value]
        nodes.append(helper.make_node(op, inputs, [f"v{i}"], name=f"{op.lower()}{i}"))
        value = f"v{i}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                          [helper.make_tensor_value_info(value, TensorProto.FLOAT, [1, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


@pytest.mark.parametrize("case", CASES)
def test_check_fails_exactly_when_explain_does(case, tmp_path, capsys):
    ops, rules, expected = CASES[case]
    model = _model(tmp_path / "m.onnx", ops)
    (tmp_path / "r.yaml").write_text(rules)
    checked = main(["check", str(model), "-r", str(tmp_path / "r.yaml")])
    out = capsys.readouterr().out
    explained = main(["explain", str(model), "-r", str(tmp_path / "r.yaml"), "-i", "x=0.5,1,2"])
    capsys.readouterr()
    assert checked == expected, out
    assert (checked != 0) == (explained != 0)


def test_check_lists_every_gap_at_once(tmp_path, capsys):
    model = _model(tmp_path / "m.onnx", ["Tan", "Atan", "Add", "Mul"])
    (tmp_path / "r.yaml").write_text("rules:\n  - op: Mul\n    rule: softmax\n  - op: Add\n    rule: ln\n")
    assert main(["check", str(model), "-r", str(tmp_path / "r.yaml")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "2 node(s) of 2 op type(s) have no implementation" in out
    assert "Tan: 1 node(s), first tan0" in out and "Atan: 1 node(s), first atan1" in out
    assert "2 rule(s) cannot apply" in out
    assert "r.yaml:2: rule 'softmax' cannot apply to node 'mul3'" in out
    assert "r.yaml:4: rule 'ln' cannot apply to node 'add2'" in out
