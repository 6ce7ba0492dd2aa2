"""The README's commands give byte-identical output whatever the hash seed (nothing may depend on
hash order, set iteration or thread timing)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

COMMANDS = [
    ["explain", "{model}", "-r", "lrp-ah-ln", "-t", "w1 w2 w3 w4", "--json", "-"],
    ["explain", "{model}", "-r", "epsilon", "-t", "w1 w2 w3 w4", "--html", "-"],
    ["explain", "{model}", "-r", "decomposition", "-t", "w1 w2 w3", "--groups", "word", "--json", "-"],
    ["audit", "{model}", "-r", "attnlrp", "-t", "w5 w6", "--json", "-"],
    ["check", "{model}", "-r", "epsilon", "--nodes"],
    ["explain", "{model}", "--method", "ig", "-o", "steps=4", "-t", "w1 w2 w3 w4", "--json", "-"],
    ["rules"],
    ["methods"],
]


def _run(argv: list[str], seed: int) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "rulegraph.cli", *argv], capture_output=True, env=env, timeout=300)
    assert done.returncode in (0, 1), done.stderr.decode()
    return done.stdout


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c[:1] + c[2:4]).replace("{model} ", "") for c in COMMANDS])
def test_output_is_the_same_under_every_hash_seed(argv, bert_onnx):
    argv = [a.replace("{model}", str(bert_onnx)) for a in argv]
    outputs = {seed: _run(argv, seed) for seed in (0, 1, 2, 3)}
    assert outputs[0], "no output"
    assert outputs[0] == outputs[1] == outputs[2] == outputs[3]
