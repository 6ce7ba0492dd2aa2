"""Two explanations of one target compared as the batched walk promises (float64, 1e-12 of the scale)."""
from __future__ import annotations

import torch


def same(a, b, rounding: float | None = None) -> None:
    """``a`` (from the batched walk) equals ``b`` (one target) to 1e-12 relative, audit included, from the same
    forward values. ``rounding``: the two were rounded otherwise (another device, the audit's sums taken in
    another order), every figure to that relative tolerance."""
    tolerance = rounding or 1e-12

    def _close(x: float, y: float, scale: float) -> None:
        assert abs(x - y) <= tolerance * scale, (x, y)

    assert a.target == b.target
    if rounding is None:
        assert a.output_value == b.output_value
    for x, y in zip(a.output_value, b.output_value, strict=True):
        _close(x, y, max(abs(v) for v in b.output_value))
    for key in a.boundary:
        torch.testing.assert_close(a.boundary[key].cpu(), b.boundary[key], rtol=0,
                                   atol=tolerance * float(b.boundary[key].abs().max()))
    assert (a.audit is None) == (b.audit is None)
    if a.audit is None:
        return
    scale = max(abs(v) for v in b.output_value)
    ca, cb = a.audit.conservation, b.audit.conservation
    for field in ("output_value", "input_total", "absorbed", "breaks", "residual"):
        _close(getattr(ca, field), getattr(cb, field), scale)
    assert [n.name for n in a.audit.nodes] == [n.name for n in b.audit.nodes]
    for na, nb in zip(a.audit.nodes, b.audit.nodes):
        for field in ("relevance_in", "relevance_out", "absorbed", "breaks", "error"):
            _close(getattr(na, field), getattr(nb, field), scale)
    assert a.audit.ok == b.audit.ok
