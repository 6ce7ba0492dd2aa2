"""ONNX files made the way deployments make them: ``torch.onnx.export`` of small plain-torch models
(a CNN classifier and a tiny transformer classifier ending in Softmax or LogSoftmax, an output without
a batch axis, an int64 input passed through as the first output, an op rulegraph lacks, a tiny
embedding table, a detector that needs a spatial size its strides divide)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import cnn

VOCAB, WIDTH, CLASSES = 4, 8, 3


class Attention(nn.Module):
    """One head of self-attention, then LayerNorm over the residual."""

    def __init__(self, d: int):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        a = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) / self.q.in_features ** 0.5, -1)
        return self.norm(x + self.o(a @ self.v(x)))


class Transformer(nn.Module):
    """ids → embedding (``vocab`` rows) → attention → mean over positions → classes → ``final``."""

    def __init__(self, vocab: int = VOCAB, final: str | None = "Softmax"):
        super().__init__()
        self.embed, self.block = nn.Embedding(vocab, WIDTH), Attention(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)
        self.final = {"Softmax": nn.Softmax(-1), "LogSoftmax": nn.LogSoftmax(-1), None: nn.Identity()}[final]

    def forward(self, input_ids):
        return self.final(self.head(self.block(self.embed(input_ids)).mean(1)))


class Tagger(nn.Module):
    """ids → embedding → linear: ``[positions, classes]`` for the one item (the batch axis squeezed away)."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB + 6, WIDTH), nn.Linear(WIDTH, 7)

    def forward(self, input_ids):
        return self.head(torch.relu(self.embed(input_ids)))[0]


class PassThrough(nn.Module):
    """The ids passed through as the first output, the classifier's logits second."""

    def __init__(self):
        super().__init__()
        self.inner = Transformer(VOCAB + 6, None)

    def forward(self, input_ids):
        return input_ids, self.inner(input_ids)


class Tangent(nn.Module):
    """A CNN whose features go through tan (an op rulegraph has no implementation of)."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4, CLASSES)

    def forward(self, x):
        return self.head(torch.tan(self.conv(x)).mean((2, 3)))


class Detector(nn.Module):
    """Five stride-2 convolutions (stride 32), then an upsampled deep map joined to a shallow one:
    the spatial size must be a multiple of 32."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(3 if i == 0 else 4, 4, 3, stride=2, padding=1) for i in range(5))
        self.head = nn.Linear(4, CLASSES)

    def forward(self, x):
        maps = []
        for conv in self.convs:
            x = torch.relu(conv(x))
            maps.append(x)
        fused = torch.cat([maps[3], nn.functional.interpolate(maps[4], scale_factor=2.0)], 1)
        return self.head(fused.mean((2, 3))[:, :4] + fused.mean((2, 3))[:, 4:])


class Segmenter(nn.Module):
    """A dense map: conv → relu → 1×1 conv to one channel, ``[batch, 1, H, W]``."""

    def __init__(self):
        super().__init__()
        self.conv, self.out = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 1, 1)

    def forward(self, x):
        return self.out(torch.relu(self.conv(x)))


def cnn_classifier(final: str) -> nn.Module:
    """tests.cnn's VGG-like CNN with a final ``Softmax`` or ``LogSoftmax``."""
    return nn.Sequential(cnn.build("cnn"), nn.Softmax(-1) if final == "Softmax" else nn.LogSoftmax(-1)).eval()


def export(module: nn.Module, path: Path, example: torch.Tensor, *, input_name: str, outputs: list[str],
           dynamic: dict | None = None) -> Path:
    """``torch.onnx.export`` (the TorchScript exporter, opset 17, float32 weights), as deployments do."""
    module = module.float().eval()
    torch.onnx.export(module, (example if not example.is_floating_point() else example.float(),), str(path),
                      input_names=[input_name], output_names=outputs, opset_version=17, dynamo=False,
                      dynamic_axes=dynamic)
    return path


def ids(batch: int = 2, length: int = 5, vocab: int = VOCAB, *, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))



def model(name: str) -> nn.Module:
    """The torch module of the file ``name`` (see :func:`files`), built afresh with the same weights, float32."""
    torch.manual_seed(0)
    kind, _, final = name.partition("-")
    made = {"cnn": lambda: cnn_classifier(final), "transformer": lambda: Transformer(final=final),
            "tagger": Tagger, "pass": PassThrough, "tan": Tangent, "tiny": lambda: Transformer(final=None),
            "detector": Detector, "segmenter": Segmenter}[kind]()
    return made.float().eval()


def files(folder: Path) -> dict[str, Path]:
    """Every file above, exported into ``folder``: ``cnn-Softmax``, ``cnn-LogSoftmax``, ``transformer-Softmax``,
    ``transformer-LogSoftmax`` (batch and sequence free), ``tagger`` (ids [batch, sequence], output [sequence, 7]), ``pass-through``
    (outputs ``ids`` then ``logits``), ``tan``, ``tiny-vocab`` (a 4-row table, no final softmax), ``segmenter``
    (a [batch, 1, H, W] map) and ``detector`` (height and width free)."""
    batch, tokens = {0: "batch"}, {0: "batch", 1: "sequence"}
    how = {
        **{f"cnn-{f}": (cnn.image(1, 8), "pixel_values", ["probs"],
                            {"pixel_values": batch, "probs": batch}) for f in ("Softmax", "LogSoftmax")},
        **{f"transformer-{f}": (ids(), "input_ids", ["probs"], {"input_ids": tokens, "probs": batch})
           for f in ("Softmax", "LogSoftmax")},
        "tagger": (ids(1, 7), "input_ids", ["logits"], {"input_ids": tokens, "logits": {0: "sequence"}}),
        "pass-through": (ids(), "input_ids", ["ids", "logits"], {"input_ids": tokens, "ids": tokens, "logits": batch}),
        "tan": (cnn.image(1, 8), "pixel_values", ["logits"], {"pixel_values": batch, "logits": batch}),
        "tiny-vocab": (ids(), "input_ids", ["logits"], {"input_ids": tokens, "logits": batch}),
        "segmenter": (cnn.image(1, 8), "pixel_values", ["mask"], {"pixel_values": batch, "mask": batch}),
        "detector": (cnn.image(1, 64), "pixel_values", ["logits"],
                     {"pixel_values": {0: "batch", 2: "height", 3: "width"}, "logits": batch}),
    }
    return {name: export(model(name), folder / f"{name}.onnx", example, input_name=input_name, outputs=outputs,
                         dynamic=dynamic) for name, (example, input_name, outputs, dynamic) in how.items()}
