"""The command line on files as deployments export them (tests/deployed.py): `check` refuses with
`explain`'s own one-line reason, `--output` chooses any value in both, `--position` picks a row of
an output without a batch axis, the header says where a final Softmax was moved before, and
`rulegraph rules NAME` prints the file as it is."""
from __future__ import annotations

import numpy as np
import pytest

import cnn
import deployed
from rulegraph.cli import main
from rulegraph.ruleset import shipped_rule_sets


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deployed-cli")
    made = deployed.files(folder)
    np.save(folder / "image.npy", cnn.image(1, 8).float().numpy())
    made["image"] = folder / "image.npy"
    return made


def run(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, " ".join(captured.out.split()), " ".join(captured.err.split())


@pytest.mark.parametrize("name, rules, inputs, reason", [
    ("tan", "epsilon", "pixel_values=IMAGE", "node '/Tan': op 'Tan' (opset 17) has no implementation in rulegraph"),
    ("pass-through", "epsilon", "input_ids=1,2,3", "output 'ids' does not depend on the relevance boundary "
                                                   "(input_ids); outputs that can be explained: 'logits'"),
    ("cnn-Softmax", "epsilon-gamma-box --score probability", "pixel_values=IMAGE",
     "no rule matches node '/1/Softmax' (op Softmax)"),
    ("transformer-Softmax", "epsilon-plus-flat", "input_ids=1,2,3", "no relevance boundary"),
])
def test_check_and_explain_refuse_with_the_same_line(files, capsys, name, rules, inputs, reason):
    rules = rules.split()
    inputs = inputs.replace("IMAGE", str(files["image"]))
    code, _, err = run(capsys, "explain", files[name], "-r", *rules, "-i", inputs)
    assert code != 0 and reason in err, err
    line = err.removeprefix("error: ")
    code, out, _ = run(capsys, "check", files[name], "-r", *rules)
    assert code == 1 and f"explain refuses: {line}" in out, (line, out)


def test_check_and_explain_take_any_value_as_output(files, capsys):
    code, out, _ = run(capsys, "check", files["pass-through"], "-r", "epsilon", "--output", "logits")
    assert code == 0 and "explain runs on made-up inputs" in out, out
    code, out, _ = run(capsys, "explain", files["pass-through"], "-r", "epsilon", "-i", "input_ids=1,2,3",
                       "--output", "logits")
    assert code == 0 and "explained logits[" in out
    code, _, err = run(capsys, "check", files["pass-through"], "-r", "epsilon", "--output", "nope")
    assert code == 1


def test_the_header_says_the_final_softmax_was_moved_before(files, capsys):
    code, out, _ = run(capsys, "explain", files["cnn-Softmax"], "-r", "epsilon-gamma-box", "-i",
                       f"pixel_values={files['image']}")
    assert code == 0
    assert "final Softmax probs = Softmax(/0/0.12/Gemm_output_0): the logits before it are explained" in out
    assert "explained /0/0.12/Gemm_output_0[" in out and "expected breaks (by rule design) +0 in 0 node(s)" in out
    code, out, _ = run(capsys, "explain", files["cnn-Softmax"], "-r", "epsilon", "-i",
                       f"pixel_values={files['image']}", "--score", "probability")
    assert code == 0 and "explained probs[" in out and "final Softmax" not in out
    assert "the rules of `epsilon` at 1 node(s) (Softmax) do not conserve" in out      # the words match the audit


@pytest.mark.parametrize("method", ["gs", "ig", "loo"])
def test_a_baseline_s_header_says_the_final_softmax_was_moved_before(files, capsys, method):
    option = ["-o", "loo.mode=delete"] if method == "loo" else []
    code, out, err = run(capsys, "explain", files["transformer-Softmax"], "--method", method, *option, "-i",
                         "input_ids=1,2,3")
    assert code == 0, err
    assert "final Softmax probs = Softmax(/head/Gemm_output_0): the logits before it are explained" in out, out
    assert "explained /head/Gemm_output_0[" in out
    code, out, err = run(capsys, "explain", files["transformer-Softmax"], "--method", method, *option, "-i",
                         "input_ids=1,2,3", "--score", "probability")
    assert code == 0 and "explained probs[" in out and "final Softmax" not in out, err


def test_position_picks_a_row_of_an_output_without_a_batch_axis(files, capsys):
    code, out, _ = run(capsys, "explain", files["tagger"], "-r", "gi", "-i", "input_ids=1,2,3,4,5,6,7",
                       "--position", "2", "--json", "-")
    assert code == 0
    import json
    doc = json.loads(out)
    assert doc["position"] == 2 and len(doc["output_value"] if isinstance(doc["output_value"], list) else [1]) == 1


@pytest.mark.parametrize("name", sorted(shipped_rule_sets(None)))
def test_rules_name_prints_the_file_verbatim(capsys, name):
    code = main(["rules", name])
    assert code == 0
    assert capsys.readouterr().out == shipped_rule_sets(None)[name].read_text()


def test_region_explains_the_sum_of_a_map(files, capsys):
    code, out, _ = run(capsys, "explain", files["segmenter"], "-r", "epsilon", "-i", f"pixel_values={files['image']}",
                       "--region", "2:5,1:7")
    assert code == 0 and "explained mask: region[2:5, 1:7] =" in out, out
    code, _, err = run(capsys, "explain", files["segmenter"], "-r", "epsilon", "-i", f"pixel_values={files['image']}",
                       "--region", "2-5,1:7")
    assert code == 2 and "--region must look like y0:y1,x0:x1" in err
