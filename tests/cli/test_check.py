"""`rulegraph check` fails whenever `explain` would for a reason it can see without inputs, and
names every gap at once: ops with no implementation, rules that cannot apply, nodes without a rule."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import rulegraph
import rulegraph.rules
from rulegraph.cli import main
from rulegraph.errors import RulegraphError

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
    assert explained == (2 if checked else 0)           # check's gap is explain's one-line error, not a defect (3)


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


def test_check_lists_every_gap_of_a_mobilenet_at_once(tmp_path, capsys):
    """A MobileNetV3-style export with an op that has no kernel (a HardSwish turned into Tan), under the
    CNN rule set without its gate entries and with zB bounds for 2 channels (the image has 3): one run
    names the op, the rule that does not fit the first convolution, and every Mul without a rule."""
    import cnn
    import re
    from rulegraph.rules import shipped_rule_sets
    path = cnn.onnx(cnn.build("mobilenetv3"), tmp_path / "m.onnx", cnn.image(1, 8))
    model = onnx.load(path)
    swish = next(n for n in model.graph.node if n.op_type == "HardSwish")
    swish.op_type = "Tan"
    onnx.save(model, path)
    text = shipped_rule_sets("cnns")["epsilon-gamma-box"].read_text()
    text = re.sub(r"  - op: Mul\n(    .*\n)+?    params: \{gate: [01]\}\n", "", text)
    text = text.replace("params: {low: [-2.1179039, -2.0357143, -1.8044444], high: [2.2489083, 2.4285715, 2.64]}",
                        "params: {low: [0, 0], high: [1, 1]}")
    assert "rule: gate" not in text and "low: [0, 0]" in text
    (tmp_path / "r.yaml").write_text(text)
    assert main(["check", str(path), "-r", str(tmp_path / "r.yaml")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "1 node(s) of 1 op type(s) have no implementation" in out and f"Tan: 1 node(s), first {swish.name}" in out
    first_conv = next(n.name for n in model.graph.node if n.op_type == "Conv")
    assert (f"rule 'zbox' cannot apply to node '{first_conv}' (op Conv): 2 bounds per channel (low/high) but the "
            "convolution takes 3 input channels") in out
    muls = [n.name for n in model.graph.node if n.op_type == "Mul"]
    assert f"{len(muls)} node(s) without a rule" in out
    assert all(f"{name} (Mul)" in out for name in muls)
    with pytest.raises(RulegraphError):           # and explain stops too
        rulegraph.explain(str(path), str(tmp_path / "r.yaml"), {"pixel_values": cnn.image(1, 8)})


def test_check_names_every_bad_entry_of_a_rule_file_at_once(tmp_path, capsys):
    model = _model(tmp_path / "m.onnx", ["Add", "Mul"])
    (tmp_path / "r.yaml").write_text("rules:\n  - op: Conv\n    rule: gamma\n    params: {gama: 0.1}\n"
                                     "  - op: Mul\n    rule: gate\n    params: {gate: -1}\n"
                                     "  - op: Add\n    rule: epsilonn\n")
    assert main(["check", str(model), "-r", str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr().err
    assert "r.yaml:4: rule 'gamma' has no param 'gama'; did you mean 'gamma'?" in err
    assert "(and 2 more: " in err and "r.yaml:7: param 'gate' of rule 'gate' must be ≥ 0, got -1" in err
    assert "r.yaml:9: unknown rule 'epsilonn'" in err and "Traceback" not in err


# -- what only running shows: check runs explain on made-up inputs at two lengths --------------------------------

def _sequence_model(path, nodes, inits=(), opset=18):
    """x [1, sequence, 2] → nodes → y."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence", 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], initializer=list(inits))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def _explain_fails(model, length):
    import torch
    try:
        rulegraph.explain(str(model), "gi", {"x": torch.ones(1, length, 2)})
    except RulegraphError as exc:
        return str(exc)
    return None


def test_check_fails_where_a_reshape_was_fixed_to_the_traced_length(tmp_path, capsys):
    """A Reshape to a constant shape (an export fixed to its traced length): fine at 6 positions, not at 11."""
    from onnx import numpy_helper
    import numpy as np
    model = _sequence_model(tmp_path / "m.onnx", [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="fixed_reshape"),
        helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=0)],
        [numpy_helper.from_array(np.array([1, 12], np.int64), "shape"),
         numpy_helper.from_array(np.array([1], np.int64), "axes")])
    assert main(["check", str(model), "-r", "gi"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "node 'fixed_reshape' (Reshape) failed" in out and "x 1×11" in out
    assert _explain_fails(model, 6) is None
    assert "fixed_reshape" in _explain_fails(model, 11)


def test_check_names_an_op_mode_with_no_implementation(tmp_path, capsys):
    from onnx import numpy_helper
    import numpy as np
    model = _sequence_model(tmp_path / "m.onnx", [
        helper.make_node("Unsqueeze", ["x", "zero"], ["x4"]),
        helper.make_node("Resize", ["x4", "", "scales"], ["big"], name="smooth", mode="linear", antialias=1),
        helper.make_node("ReduceSum", ["big", "axes"], ["y"], keepdims=0)],
        [numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([1, 1, 0.5, 1], np.float32), "scales"),
         numpy_helper.from_array(np.array([1, 2, 3], np.int64), "axes")])
    assert main(["check", str(model), "-r", "gi"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "node 'smooth' (Resize) failed" in out and "antialias is not supported" in out
    assert "smooth" in _explain_fails(model, 6)


def test_a_rule_failing_on_values_is_named_not_an_internal_error(tmp_path, capsys, monkeypatch):
    """Whatever a rule raises becomes an error naming the node and the rule's line, in explain and in check."""
    from rulegraph.propagation.gradient import Gradient

    def boom(self, site):
        raise RuntimeError("shapes do not broadcast")
    monkeypatch.setattr(Gradient, "propagate", boom)
    model = _model(tmp_path / "m.onnx", ["Add", "Mul"])
    assert main(["check", str(model), "-r", "gi"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    line = 1 + next(i for i, t in enumerate(Path(rulegraph.rules.__file__).with_name("gi.yaml").read_text().splitlines())
                    if t.strip() == '- op: "*"')
    assert f"rules/gi.yaml:{line}: the rule of node 'mul1' (Mul) failed: RuntimeError: shapes do not broadcast" in out
    assert main(["explain", str(model), "-r", "gi", "-i", "x=0.5,1,2"]) == 2
    assert "internal error" not in capsys.readouterr().err
