"""The ``quantization`` rule on x̃ = x + δ (a quantize–dequantize round trip, δ the rounding), against
its closed form in float64: R(x) = x ⊙ R(x̃)/x̃, δ absorbing R(x̃) − R(x) — all of it where the rounding
made x̃ = 0 — and in signal form Gradient×Input with δ detached."""
from __future__ import annotations

import torch

from rulegraph.ir import Node
from rulegraph.ops import REGISTRY
from rulegraph.ops.quantization import RULEGRAPH_DOMAIN
from rulegraph.propagation import RULES
from rulegraph.propagation.signal import Contribution, Incoming, Site

SPEC = REGISTRY[(RULEGRAPH_DOMAIN, "QuantizeDequantize")]
NODE = Node("q", "QuantizeDequantize", ("x", "d"), ("y",), domain=RULEGRAPH_DOMAIN)


def _site(x, delta, arriving):
    y = x + delta
    incoming = Incoming(y)
    incoming.add(arriving)
    return Site(node=NODE, spec=SPEC, attrs={}, inputs=[x, delta], outputs=[y], tainted=[True, False],
                incoming=[incoming])


def test_explicit_relevance_is_split_by_the_share_of_x():
    x = torch.tensor([0.31, -1.2, 0.004, 2.0], dtype=torch.float64)
    scale = 0.05
    delta = torch.round(x / scale) * scale - x                    # x[2] rounds to x̃ = 0
    r = torch.tensor([0.7, -0.2, 0.3, 1.1], dtype=torch.float64)  # explicit R(x̃), non-zero where x̃ = 0
    site = _site(x, delta, Contribution(relevance=r))
    rule = RULES["relevance"].get("quantization")()
    out = rule.propagate(site)
    y = x + delta
    expected = torch.where(y == 0, 0.0, x / torch.where(y == 0, 1.0, y)) * r
    torch.testing.assert_close(out[0].tensor(x), expected, rtol=1e-15, atol=0)
    assert out[1] is None and len(site.absorbed) == 1
    torch.testing.assert_close(site.absorbed[0], r - expected, rtol=1e-15, atol=1e-17)
    assert site.absorbed[0][2] == r[2]                              # all of it where x̃ = 0
    assert rule.conserves(NODE, SPEC, [True, False]) and rule.carries(NODE, SPEC, [True, True]) == [True, False]


def test_signal_form_is_gradient_times_input_with_the_rounding_detached():
    x = torch.tensor([0.31, -1.2, 0.5], dtype=torch.float64)
    delta = torch.tensor([-0.01, 0.0, 0.02], dtype=torch.float64)
    g = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    out = RULES["relevance"].get("quantization")().propagate(_site(x, delta, Contribution(signal=g)))
    torch.testing.assert_close(out[0].tensor(x), x * g)
    torch.testing.assert_close(out[1].tensor(delta), delta * g)       # the rounding's share, absorbed by the walk
