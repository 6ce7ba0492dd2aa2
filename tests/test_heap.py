"""The C heap kept between explanations (rulegraph.heap): what one explanation freed serves the next,
instead of being taken back from the system page by page; not so where RULEGRAPH_KEEP_HEAP=0."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from rulegraph import heap

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

#: the page faults of the first and of the last of four explanations of 64 rows of 64 tokens (the tiny BERT's
#: values then take some 80 MiB: about 22,000 pages the first time)
FOUR = """
import resource, sys, torch
import rulegraph
graph = rulegraph.load(sys.argv[1])
ids = torch.randint(5, 30, (64, 64), generator=torch.Generator().manual_seed(0))
feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rulegraph.explain(graph, "lrp-ah-ln", feeds)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[0], faults[-1], rulegraph.heap.keep_freed())
"""


def _run(model, **environment: str) -> tuple[int, int, bool]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **environment}
    done = subprocess.run([sys.executable, "-c", FOUR, str(model)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    first, last, kept = done.stdout.split()
    return int(first), int(last), kept == "True"


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_a_repeated_explanation_takes_no_memory_back_from_the_system(bert_onnx):
    first, last, kept = _run(bert_onnx)
    assert kept and first > 10_000
    assert last < first / 20, (first, last)         # (without: up to 9,000 faults again, as glibc's thresholds go)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_turned_off_by_the_environment(bert_onnx):
    assert _run(bert_onnx, RULEGRAPH_KEEP_HEAP="0")[2] is False


def test_set_once_and_only_on_glibc():
    assert heap.keep_freed() == GLIBC
    assert heap.keep_freed() == GLIBC       # (a second call asks malloc nothing)
