"""The README's commands give byte-identical output whatever the hash seed (nothing may depend on
hash order, set iteration or thread timing): one process per seed runs every command."""
from __future__ import annotations

import json
import os
import subprocess
import sys

COMMANDS = [
    ["explain", "{model}", "-r", "lrp-ah-ln", "-t", "w1 w2 w3 w4", "--json", "-"],
    ["explain", "{model}", "-r", "epsilon", "-t", "w1 w2 w3 w4", "--html", "-"],
    ["explain", "{model}", "-r", "decomposition", "-t", "w1 w2 w3", "--groups", "word", "--json", "-"],
    ["explain", "{model}", "--method", "ig", "-o", "steps=4", "-t", "w1 w2 w3 w4", "--json", "-"],
    ["audit", "{model}", "-r", "attnlrp", "-t", "w5 w6", "--json", "-"],
    ["check", "{model}", "-r", "epsilon", "--nodes"],
    ["rules"],
    ["methods"],
]

#: runs each command of argv[1] (JSON) in this process and prints {command index: stdout}
DRIVER = """
import contextlib, io, json, sys
from rulegraph.cli import main
outputs = {}
for i, argv in enumerate(json.loads(sys.argv[1])):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(argv)
    outputs[i] = [code, buffer.getvalue()]
print(json.dumps(outputs))
"""


def test_every_command_gives_the_same_bytes_under_every_hash_seed(bert_onnx):
    commands = [[a.replace("{model}", str(bert_onnx)) for a in argv] for argv in COMMANDS]
    runs = []
    for seed in ("0", "1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(commands)], capture_output=True, env=env,
                              timeout=600)
        assert done.returncode == 0, done.stderr.decode()
        runs.append(json.loads(done.stdout))
    for i, argv in enumerate(COMMANDS):
        code, text = runs[0][str(i)]
        assert code == 0 and text, (argv, code)
        assert all(run[str(i)] == [code, text] for run in runs[1:]), f"output of {argv} depends on the hash seed"
