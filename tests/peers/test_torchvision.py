"""Full rule coverage on torchvision exports (random weights): ResNet-18 and VGG-11 with the
CNN composites, ViT-B/16 with AttnLRP and CP-LRP. Needs torchvision (peers environment:
``.peers/bin/python -m pytest -m peer``); the exports are cached in ``.cache/torchvision-onnx``
(``benchmarks/export_torchvision.py`` writes them too)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.peer
torchvision = pytest.importorskip("torchvision")

import rulegraph  # noqa: E402
from rulegraph.ruleset import RuleSet  # noqa: E402

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "torchvision-onnx"
CASES = [("resnet18", "epsilon-gamma-box"), ("resnet18", "epsilon-plus-flat"), ("vgg11", "epsilon-gamma-box"),
         ("vgg11", "epsilon-plus-flat"), ("vit_b_16", "attnlrp"), ("vit_b_16", "cp-lrp")]


def export(name: str) -> Path:
    """The model with random weights, exported once (TorchScript exporter, BatchNorm kept)."""
    path = CACHE / f"{name}.onnx"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None).eval()
        torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), str(path), input_names=["pixel_values"],
                          output_names=["logits"], opset_version=17, dynamo=False, do_constant_folding=False)
    return path


@pytest.mark.parametrize("name, rules", CASES)
def test_full_coverage(name, rules):
    graph = rulegraph.load(str(export(name)))
    binding = (RuleSet.load(rules)).bind(graph)
    assert not binding.unmatched, sorted({n.op for n in binding.unmatched})
