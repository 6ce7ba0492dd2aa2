"""``rulegraph evaluate``, ``rulegraph methods`` and ``rulegraph explain --method`` on the command line."""
from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

import bow
from rulegraph.cli import cli, main


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return bow.build(tmp_path_factory.mktemp("bow_cli"))


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows([["w1 w2 w3 w4", 1], ["w5 w6 w7", 0], ["w8 w9 w10 w11 w12", 1]])
    return path


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


class Ran:
    def __init__(self, code, out):
        self.exit_code, self.output = code, out


def fails(capsys, *args):
    """Through the entry point (which turns rulegraph errors into one line and exit code 2)."""
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return Ran(code, captured.out + captured.err)


def one_line_error(result, message):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("error:"), result.output
    assert message in " ".join(lines), result.output


def test_evaluate_prints_the_table_and_writes_outputs(model, data, tmp_path):
    out = tmp_path / "ev"
    result = invoke("evaluate", model, "--data", data, "--methods", "random,gi,ig", "--metrics", "aopc,auac",
                    "--out", out, "-o", "ig.steps=4", "--aopc-step", "10", "--steps", "4", "-q")
    assert result.exit_code == 0, result.output
    assert "aopc" in result.output and "ig" in result.output and "random" in result.output
    assert "random number" in result.output and "relevance (logit" in result.output     # the scores column
    assert len((out / "results.jsonl").read_text().splitlines()) == 3 * 3
    doc = json.loads((out / "summary.json").read_text())
    assert set(doc["table"]) == {"random", "gi", "ig"}
    assert doc["config"]["options"] == {"ig": {"steps": "4"}}
    again = invoke("evaluate", model, "--data", data, "--methods", "random,gi,ig", "--metrics", "aopc,auac",
                   "--out", out, "-o", "ig.steps=4", "--aopc-step", "10", "--steps", "4", "-q")
    assert again.exit_code == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == 3 * 3


def test_evaluate_bad_input_is_one_line(capsys, model, data, tmp_path):
    one_line_error(fails(capsys, "evaluate", model, "--data", tmp_path / "none.csv", "--methods", "gi"), "data file not found")
    one_line_error(fails(capsys, "evaluate", model, "--data", data, "--methods", "gi,bogus", "--out", tmp_path / "a"),
                   "unknown method 'bogus'")
    one_line_error(fails(capsys, "evaluate", model, "--data", data, "--methods", "gi", "-o", "steps=3",
                          "--out", tmp_path / "b"), "has no option 'steps'")
    one_line_error(fails(capsys, "evaluate", model, "--data", data, "--methods", "gi,ig", "-o", "steps=3",
                          "--out", tmp_path / "c"), "name the method")
    one_line_error(fails(capsys, "evaluate", model, "--data", data, "--methods", "gi", "--metrics", "aopc,nope",
                          "--out", tmp_path / "d"), "unknown metric 'nope'")


def test_methods_lists_baselines_and_rule_sets():
    result = invoke("methods")
    assert result.exit_code == 0
    for name in ("random", "gs", "ig", "loo", "attention", "rollout", "gi", "lrp-ah-ln"):
        assert name in result.output
    assert "scores" in result.output        # a column: what each method's scores are (declared; see tests/methods)


def test_methods_fits_a_pipe_compactly():
    result = invoke("methods")
    lines = result.output.splitlines()
    from rulegraph.methods import names
    assert len(lines) < 8 * len(names()), len(lines)     # ~11 lines a method at 80 columns before
    assert any(line.startswith("loo") and "logit drop" in line for line in lines)


def test_a_partial_failure_is_reported_under_the_table(model, tmp_path, capsys):
    path = tmp_path / "d.csv"
    path.write_text("text\nw1 w2 w3\nw7 w8\n")
    import dataclasses
    import tiny
    from rulegraph.errors import InputError
    from rulegraph.methods.base import BASELINES
    base = BASELINES.get("random")

    def run(req, **options):
        if bool((req.inputs["input_ids"] == tiny.VOCAB.index("w7")).any()):
            raise InputError("cannot explain w7")
        return base.run(req, **options)
    BASELINES.add("flaky", dataclasses.replace(base, name="flaky", run=run))
    try:
        code = main(["evaluate", str(model), "--data", str(path), "--methods", "gi,flaky", "--metrics", "aopc",
                     "--out", str(tmp_path / "o"), "-q"])
    finally:
        BASELINES.remove("flaky")
    output = " ".join(capsys.readouterr().err.split())
    assert code == 0
    assert "flaky: failed on 1 of 2 texts, left out of its figures (first error: cannot explain w7)" in output


@pytest.mark.parametrize("command", ["evaluate", "methods"])
def test_help_does_not_import_torch(command):
    import subprocess
    import sys
    code = (f"import sys; from rulegraph.cli import main; main([{command!r}, '--help']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "--help" in done.stdout or "Usage" in done.stdout


def test_explain_with_a_baseline_method(bert_onnx, tmp_path):
    path = tmp_path / "e.json"
    result = invoke("explain", bert_onnx, "--method", "ig", "-o", "steps=4", "-t", "w1 w2 w3", "--json", path)
    assert result.exit_code == 0, result.output
    doc = json.loads(path.read_text())
    assert doc["tokens"] == ["[CLS]", "w1", "w2", "w3", "[SEP]"]
    result = invoke("explain", bert_onnx, "--method", "loo", "-t", "w1 w2 w3")
    assert result.exit_code == 0, result.output
    assert "w1" in result.output


def test_explain_method_errors_are_one_line(capsys, bert_onnx):
    one_line_error(fails(capsys, "explain", bert_onnx, "--method", "ig", "--rules", "gi", "-t", "w1"), "not both")
    one_line_error(fails(capsys, "explain", bert_onnx, "--rules", "gi", "-o", "steps=3", "-t", "w1"), "rule sets take none")
    one_line_error(fails(capsys, "explain", bert_onnx, "--method", "nope", "-t", "w1"), "unknown method 'nope'")
    one_line_error(fails(capsys, "explain", bert_onnx, "--method", "ig", "-o", "steps=x", "-t", "w1"), "must be int")
