"""The command line: outputs, and one-line errors with a non-zero exit for bad input."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from onnx import TensorProto, helper

import tiny
from rulegraph.cli import main


def run(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, message):
    assert code == 2
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("error:"), err
    assert message in " ".join(lines), err


def test_explain_prints_tokens_and_conservation(capsys, bert_onnx):
    code, out, err = run(capsys, "explain", bert_onnx, "--rules", "lrp-ah-ln", "--text", "w1 w2 w3 w4")
    assert code == 0, err
    assert "[CLS] w1 w2 w3 w4 [SEP]" in out
    assert "unexplained residual" in out and " ok" in out


def test_explain_json_has_the_documented_fields(capsys, bert_onnx, tmp_path):
    path = tmp_path / "e.json"
    code, _, err = run(capsys, "explain", bert_onnx, "-r", "epsilon", "-t", "w5 w6 w7", "--json", path)
    assert code == 0, err
    doc = json.loads(path.read_text())
    assert {"target", "output_value", "relevance", "tokens", "conservation", "layers"} <= set(doc)
    assert doc["tokens"] == ["[CLS]", "w5", "w6", "w7", "[SEP]"]
    assert len(doc["relevance"]["input_ids"]) == 5
    assert {"input_total", "absorbed", "breaks", "residual", "relative_error"} <= set(doc["conservation"])
    assert doc["conservation"]["breaks"] == 0.0
    for layer in doc["layers"]:
        assert {"name", "relevance_in", "relevance_out", "absorbed", "breaks", "relative_error"} <= set(layer)
    c = doc["conservation"]
    assert c["input_total"] + c["absorbed"] + c["breaks"] + c["residual"] == pytest.approx(doc["output_value"])


def test_outputs_are_not_overwritten_silently(capsys, bert_onnx, tmp_path):
    path = tmp_path / "e.json"
    path.write_text("precious")
    code, _, err = run(capsys, "explain", bert_onnx, "-r", "gi", "-t", "w1", "--json", path)
    assert_one_line_error(code, err, "exists; pass --force")
    assert path.read_text() == "precious"
    code, _, err = run(capsys, "explain", bert_onnx, "-r", "gi", "-t", "w1", "--json", path, "--force")
    assert code == 0 and json.loads(path.read_text())["method"] == "gi"


def test_html_page_is_self_contained(capsys, bert_onnx, tmp_path):
    path = tmp_path / "e.html"
    code, _, err = run(capsys, "explain", bert_onnx, "-r", "lrp-ah-ln", "-t", "w1 w2", "-t", "w3 w4 w5", "--html", path)
    assert code == 0, err
    page = path.read_text()
    assert page.count("<h2>") == 2 and "<svg" in page and "w4" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page


def test_explain_from_raw_inputs_and_target(capsys, bert_onnx, tmp_path):
    path = tmp_path / "e.json"
    code, _, err = run(capsys, "explain", bert_onnx, "-r", "gi", "--input", "input_ids=2,7,8,3", "--target", "0",
                       "--json", path, "--dtype", "float64")
    assert code == 0, err
    doc = json.loads(path.read_text())
    assert doc["target"] == 0 and len(doc["relevance"]["input_ids"]) == 4


def test_audit_and_check(capsys, bert_onnx, tmp_path):
    code, out, err = run(capsys, "audit", bert_onnx, "-r", "lrp-ah-ln", "-t", "w1 w2 w3")
    assert code == 0, err
    assert "block 1" in out and "per node" in out
    code, out, _ = run(capsys, "check", bert_onnx, "-r", "lrp-ah-ln")
    assert code == 0 and "every node relevance reaches has a rule" in out
    partial = tmp_path / "partial.yaml"
    partial.write_text("rules:\n  - op: [Gemm, Tanh]\n    rule: gradient\n")
    code, out, _ = run(capsys, "check", bert_onnx, "-r", partial, "--nodes")
    assert code == 1 and "without a rule" in out and "LayerNorm" in out


def test_rules_lists_the_shipped_sets(capsys):
    code, out, _ = run(capsys, "rules")
    assert code == 0 and "lrp-ah-ln" in out and "epsilon" in out
    code, out, _ = run(capsys, "rules", "gi")
    assert code == 0 and "rule: gradient" in out


def test_long_text_is_truncated_with_a_warning(capsys, bert_onnx):
    code, out, err = run(capsys, "explain", bert_onnx, "-r", "gi", "-t", " ".join(["w1"] * 100))
    assert code == 0
    assert "truncated to the model's limit of 64" in err


@pytest.mark.parametrize("case, message", [
    ("missing-model", "model file not found"),
    ("corrupt-model", "is not a readable ONNX model"),
    ("unknown-rules", "no rule set named 'lrp'"),
    ("yaml-typo", "bad.yaml:2: unknown key 'rul' in a rule entry; did you mean 'rule'?"),
    ("unknown-input", "--input nope: the model has no such input"),
    ("bad-values", "expected comma-separated integers"),
    ("no-inputs", "give --text"),
    ("no-tokenizer", "--text needs --tokenizer"),
    ("empty-text", "the text is empty"),
    ("bad-target", "target 7 is out of range"),
    ("missing-tokenizer-file", "tokenizer file not found"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, bert_onnx, tmp_path, case, message):
    model, rules, extra = bert_onnx, "gi", ["--text", "w1 w2"]
    if case == "missing-model":
        model = tmp_path / "nope.onnx"
    elif case == "corrupt-model":
        model = tmp_path / "bad.onnx"
        model.write_bytes(b"\x08\x07garbage" * 10)
    elif case == "unknown-rules":
        rules = "lrp"
    elif case == "yaml-typo":
        rules = tmp_path / "bad.yaml"
        rules.write_text("rules:\n  - rul: gradient\n")
    elif case == "unknown-input":
        extra = ["--input", "nope=1,2"]
    elif case == "bad-values":
        extra = ["--input", "input_ids=1,x"]
    elif case == "no-inputs":
        extra = []
    elif case == "no-tokenizer":
        model = tmp_path / "alone.onnx"
        shutil.copy(bert_onnx, model)
    elif case == "empty-text":
        extra = ["--text", "   "]
    elif case == "bad-target":
        extra += ["--target", "7"]
    elif case == "missing-tokenizer-file":
        extra += ["--tokenizer", tmp_path / "none.json"]
    code, _, err = run(capsys, "explain", model, "--rules", rules, *extra)
    assert_one_line_error(code, err, message)


def test_unsupported_op_names_node_op_and_opset(capsys, tmp_path):
    node = helper.make_node("Det", ["x"], ["y"], name="the_det")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    path = tmp_path / "det.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString())
    code, _, err = run(capsys, "explain", path, "-r", "gi", "--input", "x=1,2,3,4")
    assert_one_line_error(code, err, "node 'the_det': op 'Det' (opset 18) has no implementation")


def test_wrong_input_shape_is_reported(capsys, tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    path = tmp_path / "relu.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString())
    code, _, err = run(capsys, "explain", path, "-r", "gi", "--input", "x=1,2")
    assert_one_line_error(code, err, "input x dim 1 must be 3, got 2")


def test_export_then_explain(capsys, tmp_path):
    source = tmp_path / "hf"
    tiny.build("bert").save_pretrained(source)
    tiny.tokenizer().save(str(source / "tokenizer.json"))
    code, out, err = run(capsys, "export", source, tmp_path / "out")
    assert code == 0, err
    code, _, err = run(capsys, "export", source, tmp_path / "out")
    assert_one_line_error(code, err, "model.onnx already exists; pass --force to overwrite it")
    code, out, err = run(capsys, "explain", tmp_path / "out" / "model.onnx", "-r", "lrp-ah-ln", "-t", "w3 w9",
                         "--json", tmp_path / "onnx.json")
    assert code == 0, err
    code, out, err = run(capsys, "export", source, tmp_path / "fx", "--format", "fx")
    assert code == 0, err
    code, out, err = run(capsys, "explain", tmp_path / "fx" / "model.pt2", "-r", "lrp-ah-ln", "-t", "w3 w9",
                         "--json", tmp_path / "fx.json")
    assert code == 0, err
    from_onnx, from_fx = (json.loads((tmp_path / f).read_text()) for f in ("onnx.json", "fx.json"))
    assert from_fx["relevance"]["input_ids"] == pytest.approx(from_onnx["relevance"]["input_ids"], rel=1e-4, abs=1e-7)
    assert from_fx["output"] == from_onnx["output"] == "logits"              # the .pt2 keeps names and labels
    assert from_fx["labels"] == from_onnx["labels"] == ["negative", "positive"]


def test_a_rule_set_as_a_method_takes_its_options_as_explain_takes_its_flags(capsys, bert_onnx):
    """``--method R -o score=logprob`` explains what ``-r R --score logprob`` does; a pass's option
    (``-o alpha=abs``) reaches the pass."""
    import json
    outputs = []
    for argv in (["--method", "lrp-ah-ln", "-o", "score=logprob"], ["-r", "lrp-ah-ln", "--score", "logprob"],
                 ["--method", "decomposition", "-o", "alpha=abs"], ["-r", "decomposition", "--alpha", "abs"]):
        code, out, err = run(capsys, "explain", bert_onnx, *argv, "-t", "w1 w2 w3", "--json", "-")
        assert code == 0, err
        outputs.append(json.loads(out))
    assert outputs[0]["score"] == "logprob" and outputs[0]["relevance"] == outputs[1]["relevance"]
    assert outputs[2]["options"]["alpha"] == "abs" and outputs[2]["relevance"] == outputs[3]["relevance"]


def test_a_missing_optional_package_is_named_with_the_command_that_adds_it(tmp_path):
    """Without the ``hf`` extra, ``rulegraph export`` says which package is missing and how to add it (exit 2),
    not an internal error (a child process in which ``transformers`` cannot be imported)."""
    source = tmp_path / "hf"
    tiny.build("bert").save_pretrained(source)
    blocked = ("import sys; sys.modules['transformers'] = None; from rulegraph.cli import main; "
               f"sys.exit(main(['export', {str(source)!r}, {str(tmp_path / 'out')!r}]))")
    log = tmp_path / "export.log"
    with log.open("w") as f:
        code = subprocess.run([sys.executable, "-c", blocked], stdout=f, stderr=subprocess.STDOUT).returncode
    text = log.read_text()
    assert code == 2, text
    assert "optional package 'transformers'" in text and 'pip install "rulegraph[hf]"' in text, text
    assert "internal error" not in text and len(text.strip().splitlines()) == 1, text
    assert not (tmp_path / "out").exists()
