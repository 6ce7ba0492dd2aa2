"""rulegraph's CNN rule sets on ONNX exports against Zennit's composites on the torch modules.

Runs in the peers environment (``.peers/bin/python -m pytest -m peer``); skips elsewhere.
Both sides in float64 on the same (float32-representable) weights; the relevance at the
explained output is ``output ⊙ one-hot`` on both.
"""
from __future__ import annotations

import pytest
import torch

import cnn

pytestmark = pytest.mark.peer
zennit = pytest.importorskip("zennit")
from zennit.composites import EpsilonGammaBox, EpsilonPlusFlat  # noqa: E402

from rulegraph import explain  # noqa: E402
from rulegraph.ruleset import RuleSet  # noqa: E402

RTOL = 1e-6


def zbox_bounds(shape):
    rs = RuleSet.load("epsilon-gamma-box")
    zbox = next(e.rule for e in rs.entries if e.rule.name == "zbox")
    low = torch.tensor(zbox.low, dtype=torch.float64).reshape(1, 3, 1, 1).expand(shape)
    high = torch.tensor(zbox.high, dtype=torch.float64).reshape(1, 3, 1, 1).expand(shape)
    return low, high


def zennit_relevance(model, composite, x, target):
    x = x.clone().requires_grad_(True)
    with composite.context(model) as modified:
        out = modified(x)
        seed = torch.zeros_like(out)
        seed[torch.arange(len(target)), target] = 1.0
        (relevance,) = torch.autograd.grad(out, x, seed * out)
    return relevance


def relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("composite", ["epsilon-gamma-box", "epsilon-plus-flat"])
def test_composite_equals_zennit(tmp_path, name, composite):
    model = cnn.build(name)
    x = cnn.image(2, 8) if name == "cnn" else cnn.image(2, 2)
    path = cnn.onnx(model, tmp_path / f"{name}.onnx", x)
    ours = explain(str(path), composite, {"pixel_values": x}, dtype=torch.float64)
    if composite == "epsilon-gamma-box":
        if name == "mlp":
            pytest.skip("EpsilonGammaBox's first-layer rule applies to convolutions only")
        reference = EpsilonGammaBox(*zbox_bounds(x.shape))
    else:
        reference = EpsilonPlusFlat()
    theirs = zennit_relevance(model, reference, x, ours.target)
    err = relative(ours.boundary["pixel_values"], theirs)
    print(f"{name} {composite}: max relative error {err:.2e}")
    assert err <= RTOL


@pytest.mark.parametrize("composite", ["epsilon-gamma-box", "epsilon-plus-flat"])
def test_resnet18_equals_zennit_with_its_resnet_canonizer(tmp_path, composite):
    """torchvision ResNet-18, random weights, exported with its BatchNormalization nodes: the
    rule set folds them into the convolutions (``canonize: [batchnorm]``, in float64) as
    Zennit's ResNetCanonizer merges them; the canonizer also turns the residual ``+`` into a
    Sum (ε-rule), which is what the rule set does to the exported Add. With BatchNorm's
    default ε = 1e-5 the two differ by ~5e-6 per BatchNorm (see below)."""
    torchvision = pytest.importorskip("torchvision")
    from zennit.torchvision import ResNetCanonizer
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 1.5)
            # Zennit's merge leaves each BatchNorm as x / √(1 + ε) (mean 0, var 1, ε kept), scaling
            # the forward by 1 − ε/2 per BatchNorm; with ε = 0 that leftover is the identity
            mod.eps = 0.0
    model = model.double()
    x = cnn.image(1, 64)
    path = cnn.onnx(model, tmp_path / "resnet18.onnx", x, keep_batchnorm=True)
    ours = explain(str(path), composite, {"pixel_values": x}, dtype=torch.float64)
    if composite == "epsilon-gamma-box":
        reference = EpsilonGammaBox(*zbox_bounds(x.shape), canonizers=[ResNetCanonizer()])
    else:
        reference = EpsilonPlusFlat(canonizers=[ResNetCanonizer()])
    theirs = zennit_relevance(model, reference, x, ours.target)
    err = relative(ours.boundary["pixel_values"], theirs)
    print(f"resnet18 {composite}: max relative error {err:.2e}")
    assert err <= RTOL
