"""rulegraph's decomposition against PyDec 0.3.0 on a ReLU BERT. Runs in the peers
environment (`bash benchmarks/peers/setup.sh`; `.peers/bin/python -m pytest -m peer`),
skipped where PyDec is not installed.

PyDec runs the same weights through a hand-written forward on its Composition API
(``pydec_bert`` in benchmarks/decomposition_speed.py): one component per token, biases
and position embeddings in PyDec's residual, attention probabilities and LayerNorm
std from the recovered values, ReLU by PyDec's default ``affine`` algorithm — which
is signed α, Eq. 13 (D_g ↦ D_g · (relu(h) − relu(B)) / Σ_g D_g)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import rulegraph

pytestmark = pytest.mark.peer
pydec = pytest.importorskip("pydec")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))             # the benchmark imports its harness
SPEC = importlib.util.spec_from_file_location("decomposition_speed", BENCHMARKS / "decomposition_speed.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)
SMALL = dict(hidden=64, layers=3, heads=4, ffn=128, vocab=200, positions=64)


@pytest.fixture(scope="module")
def relu_bert(tmp_path_factory):
    model = bench.relu_bert(seed=2, size=SMALL)
    return model, rulegraph.load(bench.export(model, tmp_path_factory.mktemp("pydec") / "model.onnx"))


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("mode", ["components", "linearized"])
def test_signed_decomposition_agrees_with_pydec(relu_bert, dtype, tolerance, mode):
    model, graph = relu_bert
    feeds = bench.feeds(12, SMALL["vocab"], seed=3)
    feeds["attention_mask"][0, -3:] = 0          # padded keys: PyDec and rulegraph mask them alike
    e = rulegraph.explain(graph, "decomposition", feeds, dtype=dtype, alpha="signed", mode=mode)
    ours = torch.tensor([g["score"] for g in e.extra["decomposition"]["groups"]], dtype=torch.float64)
    composition = bench.pydec_bert(model.to(dtype), **feeds)
    theirs = composition.components[:, 0, e.target[0]].double()
    assert float((ours - theirs).abs().max() / theirs.abs().max()) <= tolerance
    bias = composition.residual[0, e.target[0]].double()
    assert abs(e.extra["decomposition"]["bias"] - float(bias)) <= tolerance * float(theirs.abs().max())
