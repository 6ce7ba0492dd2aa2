"""The memory a load takes, measured in a process of its own (peak RSS, ``ru_maxrss``, over the RSS
before it, after a first small load has made the imports a load makes): about one copy of the weights,
for an ONNX file (read once into one buffer: rulegraph.loaders.onnx_file) and a torch.export archive.
A property with a generous bound (1.3×), not a timing: reading the ONNX file into protobuf, checking it
from the file and copying each weight took 3× the weights."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from rulegraph.loaders import onnx_file
from rulegraph.loaders.onnx import load_onnx

from test_onnx_file import _model


def _load_in_a_child(big: Path, small: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, str(big), str(small)], capture_output=True, text=True,
                         check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


CHILD = """
import json, resource, sys
from pathlib import Path
import rulegraph
def rss():
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')) * 1024
rulegraph.load(Path(sys.argv[2]))                                  # the imports a first load makes, on a small model
before, peak_before = rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
graph = rulegraph.load(Path(sys.argv[1]))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"growth": peak - max(before, peak_before) if peak > peak_before else rss() - before,
                  "held": rss() - before}))
"""


def test_a_load_takes_about_one_copy_of_the_weights(tmp_path):
    """The peak RSS a load adds, in a process of its own, is about the weights' bytes (reading the
    file into protobuf, checking it from the file and copying each weight took over twice that)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((1024, 1024)).astype(np.float32), f"w{k}") for k in range(12)]
    nodes = [helper.make_node("MatMul", [f"h{k}" if k else "x", f"w{k}"], [f"h{k + 1}" if k < 11 else "y"])
             for k in range(12)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "big.onnx"))
    size = (tmp_path / "big.onnx").stat().st_size                         # 48 MiB of weights
    _model(tmp_path / "small.onnx")
    found = _load_in_a_child(tmp_path / "big.onnx", tmp_path / "small.onnx")
    assert found["growth"] < 1.3 * size, (found, size)
    held = load_onnx(tmp_path / "big.onnx").constants
    assert all(held[f"w{k}"].data_ptr() % onnx_file.ALIGN == 0 for k in range(12))
    assert found["held"] > 0.9 * size                                     # the weights are resident: it measures


def test_a_torch_export_archive_loads_with_about_one_copy_of_the_weights(tmp_path):
    """torch.export.load reads each weight from the archive into one tensor, and the fx lowering keeps
    the program's tensors (views, no copies)."""
    torch.manual_seed(0)
    big = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(12)]).eval()
    torch.export.save(torch.export.export(big, (torch.randn(1, 1024),)), str(tmp_path / "big.pt2"))
    small = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
    torch.export.save(torch.export.export(small, (torch.randn(1, 4),)), str(tmp_path / "small.pt2"))
    size = 12 * 1024 * 1024 * 4
    found = _load_in_a_child(tmp_path / "big.pt2", tmp_path / "small.pt2")
    assert 0.9 * size < found["held"] and found["growth"] < 1.3 * size, (found, size)
