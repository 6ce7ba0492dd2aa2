"""CNN families beyond ResNet/VGG under every rule set that claims CNNs (``models: cnns``): a hand-built
MobileNetV3-style network (Hardswish, depthwise convolution, squeeze-and-excitation with a hard sigmoid,
SiLU) and Hugging Face EfficientNet (SiLU as x·σ(x), squeeze-and-excitation with a sigmoid, explicit Pad),
exported by both ONNX exporters and by torch.export: the forward equals onnxruntime's (and the module's), every node
relevance reaches has a rule that applies, and relevance is conserved in float64."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import cnn
import rulegraph
from rulegraph.exporters import export_fx
from rulegraph.ruleset import RuleSet

F64 = torch.float64
CNN_RULE_SETS = sorted(rulegraph.shipped_rule_sets("cnns"))
SIZE = 16


class _Logits(torch.nn.Module):
    """A Hugging Face image classifier as ``forward(pixel_values) -> logits``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


class _Pixels(torch.nn.Module):
    """A plain network whose input is named ``pixel_values`` (as in the ONNX exports)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values)


def _randomize(model: torch.nn.Module) -> torch.nn.Module:
    """Weights of unit-scale activations (Hugging Face initialises near zero: logits ~1e-20)."""
    torch.manual_seed(0)
    for mod in model.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
            fan_in = mod.weight[0].numel()
            mod.weight.data.normal_(0.0, (2.0 / fan_in) ** 0.5)
            if mod.bias is not None:
                mod.bias.data.uniform_(-0.1, 0.1)
    return cnn.randomize_batchnorm(model)


def efficientnet():
    from transformers import EfficientNetConfig, EfficientNetForImageClassification
    config = EfficientNetConfig(image_size=SIZE, width_coefficient=0.1, depth_coefficient=0.1, hidden_dim=128,
                                in_channels=[8, 8], out_channels=[8, 8], kernel_sizes=[3, 3], strides=[1, 2],
                                num_block_repeats=[1, 1], expand_ratios=[1, 2], num_labels=3)
    return _Logits(_randomize(EfficientNetForImageClassification(config))).eval().double()


BUILDERS = {"mobilenetv3": lambda: _Pixels(cnn.build("mobilenetv3")).eval(), "efficientnet": efficientnet}
EXPORTERS = ("torchscript", "dynamo", "torch.export")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("cnn_families")
    x = cnn.image(2, SIZE)
    out = {}
    for name, build in BUILDERS.items():
        module = build()
        for exporter in EXPORTERS[:2]:
            path = cnn.onnx(module, folder / f"{name}_{exporter}.onnx", x, exporter=exporter)
            out[name, exporter] = (module, rulegraph.load(str(path)), path)
        out[name, "torch.export"] = (module, rulegraph.load(export_fx(module, {"pixel_values": x})), None)
    return out


CASES = [(n, e) for n in BUILDERS for e in EXPORTERS]


@pytest.mark.parametrize("name, exporter", CASES)
def test_forward_equals_onnxruntime(exports, name, exporter):
    module, graph, path = exports[name, exporter]
    x = cnn.image(3 if exporter != "dynamo" else 2, SIZE, seed=2)     # the dynamo export has a fixed batch
    with torch.no_grad():
        expected = module(x).numpy()
    assert np.abs(expected).max() > 1e-2               # weights large enough that the test can see a difference
    ours = rulegraph.run(graph, {"pixel_values": x}, dtype=F64)[graph.outputs[0]].numpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
    if path is not None:                               # the ONNX file in onnxruntime, float32
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (theirs,) = session.run(None, {"pixel_values": x.float().numpy()})
        np.testing.assert_allclose(theirs, expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("rules", CNN_RULE_SETS)
@pytest.mark.parametrize("name, exporter", CASES)
def test_every_cnn_rule_set_covers_and_conserves(exports, name, exporter, rules):
    graph = exports[name, exporter][1]
    binding = RuleSet.load(rules).bind(graph)
    assert not binding.problems and not binding.unmatched
    e = rulegraph.explain(graph, rules, {"pixel_values": cnn.image(2, SIZE)}, dtype=F64)
    c = e.audit.conservation
    assert abs(c.output_value) > 1e-2
    assert abs(c.residual) <= 1e-10 * abs(c.output_value)        # Σ R(input) + absorbed = the logit
    assert c.breaks == 0.0 and not e.audit.unexpected and not e.audit.expected
    total = float(e.boundary["pixel_values"].sum()) + c.absorbed
    assert abs(total - c.output_value) <= 1e-10 * abs(c.output_value)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_gated_products_get_the_gate_rule(exports, exporter):
    """SiLU's x·σ(x) and squeeze-and-excitation's gate·x: the gate input held constant, all to the signal."""
    for name, gates in (("mobilenetv3", {"HardSigmoid", "Sigmoid"}), ("efficientnet", {"Sigmoid"})):
        graph = exports[name, exporter][1]
        binding = RuleSet.load("epsilon-gamma-box").bind(graph)
        muls = [n for n in binding.reached if n.op == "Mul"]
        assert muls
        seen = set()
        for n in muls:
            rule = binding.assignments[n.name].rule
            assert rule.name == "gate"
            seen.add(graph.producer[n.inputs[rule.gate]].op)
            assert graph.producer[n.inputs[1 - rule.gate]].op not in ("Sigmoid", "HardSigmoid")
        assert seen == gates
        assert not {"Sigmoid", "HardSigmoid"} & {n.op for n in binding.reached}   # the gates get no relevance
