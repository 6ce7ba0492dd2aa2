"""The CNN rule sets (epsilon-plus-flat, epsilon-gamma-box) on a ConvNeXt-style block against a
float64 reference written out layer by layer from the rules' formulas (Zennit-style, no VJPs):

    x → Conv 1×1 (first layer) → channels-last LayerNorm → Linear → GELU (x·½(1+erf(x/√2))) → Linear
      → layer scale γ·h → + residual → global average pool → Linear → logits

ε-rule on dense layers, residual sums and pooling (Zennit's composites, ε = 1e-6), the gate rule on
GELU's x·Φ(x) (the signal takes all, as Zennit passes activations), the ε-rule on the layer scale and on
GELU's ½ (a diagonal linear layer), the LN rule on LayerNorm (Ali et al. 2022; Zennit's composites
have none), and on the first layer the flat rule (epsilon-plus-flat) or z^B (epsilon-gamma-box).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import cnn
import rulegraph

F64 = torch.float64
EPS = 1e-6
#: the export's float32 constants: √2 in GELU's erf(x/√2), LayerNorm's ε
SQRT2 = float(torch.tensor(2 ** 0.5, dtype=torch.float32))
LN_EPS = float(torch.tensor(1e-5, dtype=torch.float32))
C, HIDDEN, SIDE, CLASSES = 4, 8, 3, 3


class ConvNeXtBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, C, 1)
        self.norm = nn.LayerNorm(C)
        self.up, self.down = nn.Linear(C, HIDDEN), nn.Linear(HIDDEN, C)
        self.gamma = nn.Parameter(torch.rand(C) + 0.5)
        self.head = nn.Linear(C, CLASSES)

    def forward(self, x):
        h = self.stem(x)
        y = self.norm(h.permute(0, 2, 3, 1))
        y = self.down(nn.functional.gelu(self.up(y))) * self.gamma
        h = h + y.permute(0, 3, 1, 2)
        return self.head(h.mean((2, 3)))


def _stab(z):
    return z + EPS * (2 * (z >= 0).to(z.dtype) - 1)


def _dense(x, w, b, r):
    """ε-rule on x @ wᵀ + b (the bias and ε absorb)."""
    return x * ((r / _stab(x @ w.T + b)) @ w)


def reference(m: ConvNeXtBlock, x: torch.Tensor, target: int, first: str) -> torch.Tensor:
    """Relevance at the pixels, [1, 3, SIDE, SIDE], by the formulas in the module docstring."""
    p = {k: v.detach().double() for k, v in m.state_dict().items()}
    h = torch.einsum("oc,bchw->bhwo", p["stem.weight"][:, :, 0, 0], x) + p["stem.bias"]      # channels-last
    mu, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
    alpha = 1 / torch.sqrt(var + LN_EPS)
    y = (h - mu) * alpha * p["norm.weight"] + p["norm.bias"]
    u = y @ p["up.weight"].T + p["up.bias"]
    a = u * (1 + torch.erf(u / SQRT2)) * 0.5                   # GELU = (u · (1 + erf)) · ½
    d = a @ p["down.weight"].T + p["down.bias"]
    s = d * p["gamma"]
    total = h + s
    pooled = total.mean((1, 2))
    logits = pooled @ p["head.weight"].T + p["head.bias"]
    r = torch.zeros_like(logits)
    r[0, target] = logits[0, target]
    r = _dense(pooled, p["head.weight"], p["head.bias"], r)                          # head: ε
    r_total = total / (SIDE * SIDE) * (r / _stab(pooled))[:, None, None, :]          # average pool: ε
    r_h = h * r_total / _stab(total)                                                  # residual sum: ε
    r_s = s * r_total / _stab(total)
    r_d = d * p["gamma"] * r_s / _stab(s)                                             # layer scale: ε
    # down: MatMul (z-rule with ε on xW) then the bias Add (ε): R_{aW} = aW/(aW + b + ε) R, R_a = a ⊙ W(R/(aW + ε))
    aw = a @ p["down.weight"].T
    r_aw = aw * r_d / _stab(d)
    r_a = a * ((r_aw / _stab(aw)) @ p["down.weight"])
    r_half = (u * (1 + torch.erf(u / SQRT2))) * 0.5 * r_a / _stab(a)               # GELU's ½: ε
    r_u = r_half                                                                      # the gate: the signal takes all
    uw = y @ p["up.weight"].T
    r_uw = uw * r_u / _stab(u)
    r_y = y * ((r_uw / _stab(uw)) @ p["up.weight"])
    # LayerNorm: LN rule, the linear map α(I − 11ᵀ/N)·γ with α held; β absorbs
    n = h.shape[-1]
    centering = torch.eye(n, dtype=F64) - 1.0 / n
    r_h = r_h + torch.einsum("bhwi,ij,bhwj->bhwi", h, centering * p["norm.weight"],
                             alpha * r_y / y)
    w = p["stem.weight"][:, :, 0, 0]
    if first == "flat":                        # each input channel an equal share, over the stabilised count
        return (r_h.sum(-1) / _stab(torch.tensor(3.0, dtype=F64)))[:, None].expand(1, 3, SIDE, SIDE).clone()
    low = torch.tensor([-2.1179039, -2.0357143, -1.8044444], dtype=F64).reshape(1, 3, 1, 1)
    high = torch.tensor([2.2489083, 2.4285715, 2.64], dtype=F64).reshape(1, 3, 1, 1)
    wp, wn = w.clamp(min=0), w.clamp(max=0)
    z = (torch.einsum("oc,bchw->bhwo", w, x) - torch.einsum("oc,bchw->bhwo", wp, low.expand_as(x))
         - torch.einsum("oc,bchw->bhwo", wn, high.expand_as(x)))
    ratio = (r_h / _stab(z)).permute(0, 3, 1, 2)                                      # z^B without the bias
    return (x * torch.einsum("oc,bohw->bchw", w, ratio) - low * torch.einsum("oc,bohw->bchw", wp, ratio)
            - high * torch.einsum("oc,bohw->bchw", wn, ratio))


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    torch.manual_seed(0)
    m = ConvNeXtBlock().eval()
    path = cnn.onnx(m, tmp_path_factory.mktemp("convnext_block") / "m.onnx", cnn.image(2, SIDE))
    return m, path


@pytest.mark.parametrize("rules, first", [("epsilon-plus-flat", "flat"), ("epsilon-gamma-box", "zbox")])
def test_rule_set_equals_the_layerwise_reference(block, rules, first):
    m, path = block
    x = cnn.image(1, SIDE, seed=3).double()
    e = rulegraph.explain(str(path), rules, {"pixel_values": x}, dtype=F64)
    expected = reference(m, x, e.target[0], first)
    got = e.boundary["pixel_values"]
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12 * float(expected.abs().max()))
    assert e.audit.conservation.relative_error < 1e-10
