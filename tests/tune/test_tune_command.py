"""``rulegraph tune`` as a user types it: the installed entry point in a child process, its output logged
(tests/shell.py), on the bag-of-words model; its tuned file taken by ``rulegraph evaluate``; mistakes
as one line and exit 2."""
from __future__ import annotations

import csv
import random

import pytest

import bow
from shell import rulegraph

pytest.importorskip("optuna")

SPACE = "space:\n  - id: sum\n    op: ReduceSum\n    choose:\n      epsilon: {epsilon: {log: [1.0e-6, 1.0e-2]}}\n" \
        "      gradient: {}\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune_cli")
    bow.build(root / "m")
    rng = random.Random(1)
    with (root / "texts.csv").open("w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(["text", "label"])
        for i in range(8):
            w.writerow([" ".join(f"w{rng.randrange(1, 95)}" for _ in range(5)), i % 2])
    (root / "space.yaml").write_text(SPACE)
    return root


def test_a_user_tunes_then_evaluates_the_tuned_file(folder):
    args = ["tune", "m/model.onnx", "--data", "texts.csv", "--from", "gi", "--metric", "aopc", "--space",
            "space.yaml", "--trials", "2", "--aopc-k", "20", "--aopc-step", "10", "--out", "run"]
    ran = rulegraph(args, folder)
    ran.ok()
    assert "trial 0: aopc" in ran.err and "trial 1: aopc" in ran.err
    assert "split (seed 0): tune 5, validation 2, test 1" in ran.err
    assert "paired difference" in ran.out and "over 1 texts" in ran.out
    for name in ("tuned.yaml", "trials.parquet", "trials.png", "tune.json", "study.db", "split.csv"):
        assert (folder / "run" / name).stat().st_size > 0, name
    more = [("3" if k and args[k - 1] == "--trials" else a) for k, a in enumerate(args)]
    again = rulegraph(more, folder)         # resumes the study: one more trial
    again.ok()
    assert "resuming the study in run/study.db: 2 of 3 trials done" in again.err
    assert "trial 2: aopc" in again.err and "trial 0:" not in again.err and "trial 1:" not in again.err
    evaluated = rulegraph(["evaluate", "m/model.onnx", "--data", "texts.csv", "--methods", "run/tuned.yaml,gi",
                           "--out", "eval", "-q"], folder)
    evaluated.ok()
    table = (folder / "eval" / "table.csv").read_text().splitlines()
    assert any(line.startswith("run/tuned.yaml,aopc,") for line in table), table


@pytest.mark.parametrize("args,words", [
    (["--space", "bad.yaml"], "bad.yaml:5: unknown rule 'epsilom'"),
    (["--space", "none.yaml"], "--space file not found: none.yaml"),
    (["--from", "epsilom"], "no rule set named 'epsilom'"),
    (["--split", "1,2"], "--split '1,2' must be three positive numbers"),
    (["--data", "nothing.csv"], "--data file not found: nothing.csv"),
    (["--metric", "aopcx"], "Invalid value for '--metric'"),
    (["--num-workers", "2"], "--num-workers is an option of --engine ray"),
])
def test_a_mistake_is_one_line_and_exit_2(folder, args, words):
    (folder / "bad.yaml").write_text(SPACE.replace("epsilon: {epsilon", "epsilom: {epsilon"))
    given = {"--data": "texts.csv", "--from": "gi", "--metric": "aopc", "--space": "space.yaml", "--out": "bad"}
    for option, value in zip(args[::2], args[1::2]):
        given[option] = value
    ran = rulegraph(["tune", "m/model.onnx", *[x for kv in given.items() for x in kv]], folder)
    assert ran.code == 2, ran
    assert words in ran.err, ran.err
    assert "Traceback" not in ran.err and "internal error" not in ran.err


def test_without_optuna_the_command_names_the_extra_and_writes_nothing(folder, tmp_path):
    import subprocess
    import sys
    args = ["tune", str(folder / "m" / "model.onnx"), "--data", str(folder / "texts.csv"), "--from", "gi",
            "--metric", "aopc", "--out", str(tmp_path / "out")]
    blocked = f"import sys; sys.modules['optuna'] = None; from rulegraph.cli import main; sys.exit(main({args!r}))"
    log = tmp_path / "tune.log"
    with log.open("w") as f:
        code = subprocess.run([sys.executable, "-c", blocked], stdout=f, stderr=subprocess.STDOUT).returncode
    text = log.read_text()
    assert code == 2, text
    assert "optional package 'optuna'" in text and 'pip install "rulegraph[tune]"' in text, text
    assert "internal error" not in text and len(text.strip().splitlines()) == 1, text
    assert not (tmp_path / "out").exists()
