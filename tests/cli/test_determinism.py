"""Output does not depend on the interpreter's hash seed: what reaches the user follows graph
order, never the iteration order of a set."""
from __future__ import annotations

import os
import subprocess
import sys

MAIN = "import sys; from rulegraph.cli import main; sys.exit(main(sys.argv[1:]))"


def test_explain_ig_is_byte_identical_across_hash_seeds(bert_onnx):
    outputs = []
    for seed in ("0", "1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", MAIN, "explain", str(bert_onnx), "--method", "ig",
                               "-o", "steps=4", "-t", "w1 w2 w3 w4", "--json", "-"],
                              capture_output=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr.decode()
        outputs.append(done.stdout)
    assert outputs[0] and all(o == outputs[0] for o in outputs[1:])
