"""Tiny CNNs in plain torch.nn (no torchvision), exported to ONNX for the vision rule sets."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class Block(nn.Module):
    """A ResNet basic block: conv-bn-relu-conv-bn, plus the identity, then relu."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + x)


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation (Hu et al. 2018) as in MobileNetV3: x · hardsigmoid(conv(relu(conv(pool x))))."""

    def __init__(self, c: int, reduced: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(c, reduced, 1), nn.Conv2d(reduced, c, 1)
        self.relu, self.gate = nn.ReLU(), nn.Hardsigmoid()

    def forward(self, x):
        return self.gate(self.fc2(self.relu(self.fc1(self.pool(x))))) * x      # the gate first, as torchvision


class InvertedResidual(nn.Module):
    """MobileNetV3's block: 1×1 expansion, depthwise 3×3, both with Hardswish, SE, 1×1 projection, plus x."""

    def __init__(self, c: int, expanded: int):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, expanded, 1, bias=False), nn.BatchNorm2d(expanded), nn.Hardswish())
        self.depthwise = nn.Sequential(nn.Conv2d(expanded, expanded, 3, padding=1, groups=expanded, bias=False),
                                       nn.BatchNorm2d(expanded), nn.Hardswish())
        self.se = SqueezeExcite(expanded, 4)
        self.project = nn.Sequential(nn.Conv2d(expanded, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.project(self.se(self.depthwise(self.expand(x))))


def build(name: str, *, seed: int = 0) -> nn.Module:
    """``mlp``, ``cnn`` (VGG-like: conv/relu/maxpool, avgpool, dense), ``resnet`` (with BatchNorm) or
    ``mobilenetv3`` (Hardswish, an inverted residual with squeeze-and-excitation, SiLU as x·σ(x))."""
    torch.manual_seed(seed)
    if name == "mlp":
        m = nn.Sequential(nn.Flatten(), nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 3))
    elif name == "cnn":
        m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                          nn.Conv2d(6, 5, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    elif name == "resnet":
        m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.MaxPool2d(3, stride=2, padding=1), Block(4), Block(4),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    elif name == "mobilenetv3":
        m = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.Hardswish(),
                          InvertedResidual(8, 16), nn.Conv2d(8, 12, 1), nn.SiLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(12, 10), nn.Hardswish(), nn.Linear(10, 3))
    else:
        raise ValueError(name)
    randomize_batchnorm(m)
    return m.eval().double()


def randomize_batchnorm(m: nn.Module) -> nn.Module:
    """Non-trivial running statistics and affine parameters in every BatchNorm."""
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.3, 0.3)
    return m


def image(batch: int = 2, size: int = 8, *, seed: int = 1) -> torch.Tensor:
    """ImageNet-normalised pixels: uniform [0, 1] then (x − mean) / std per channel."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, 3, size, size, generator=g, dtype=torch.float64)
    mean = torch.tensor([0.485, 0.456, 0.406], dtype=torch.float64).reshape(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64).reshape(1, 3, 1, 1)
    return (x - mean) / std


def onnx(module: nn.Module, path: Path, example: torch.Tensor, *, keep_batchnorm: bool = False,
         exporter: str = "torchscript") -> Path:
    """Export with the TorchScript exporter (float32 weights, as models ship). It folds
    BatchNorm into the convolutions (in float32) unless ``keep_batchnorm``. ``exporter="dynamo"``:
    the torch.export-based exporter instead (opset 18, static shapes; its optimiser folds BatchNorm)."""
    if exporter == "dynamo":
        torch.onnx.export(module.float(), (example.float(),), str(path), input_names=["pixel_values"],
                          output_names=["logits"], opset_version=18, dynamo=True, external_data=False, verbose=False)
    else:
        torch.onnx.export(module.float(), (example.float(),), str(path), input_names=["pixel_values"],
                          output_names=["logits"], opset_version=17, dynamo=False,
                          do_constant_folding=not keep_batchnorm,
                          dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}})
    module.double()
    return path
