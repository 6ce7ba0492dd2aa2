"""rulegraph's conditional relevance (``--condition``) on a small CNN against zennit-crp's channel-conditional
heatmaps (Achtibat et al. 2023, "From attribution maps to human-understandable explanations through Concept
Relevance Propagation", Nature Machine Intelligence), both under the epsilon-plus-flat composite.

Runs in the peers environment (``.peers/bin/python -m pytest -m peer``; ``benchmarks/peers/setup.sh`` installs
zennit-crp); skips elsewhere. Both sides in float64 on the same (float32-representable) weights; the relevance
at the explained output is ``output ⊙ one-hot`` on both, and zennit-crp's heatmap is the input relevance summed
over the colour channels.
"""
from __future__ import annotations

import pytest
import torch

import cnn

pytestmark = pytest.mark.peer
pytest.importorskip("zennit")
crp = pytest.importorskip("crp.attribution")
from zennit.composites import EpsilonPlusFlat  # noqa: E402

import rulegraph  # noqa: E402

RTOL = 1e-10
#: the CNN's convolutions by their module names (``cnn.build("cnn")``, an nn.Sequential)
CONVS = ("0", "3", "6")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    x = cnn.image(1, 8)
    module = cnn.build("cnn")
    path = cnn.onnx(module, tmp_path_factory.mktemp("crp") / "cnn.onnx", x)
    module.float().double()         # the exported weights (float32) in float64, as the ONNX file holds them
    return module, path, x


def crp_heatmap(module, x, target: int, conditions: dict[str, list[int]]) -> torch.Tensor:
    attribution = crp.CondAttribution(module, no_param_grad=True)
    data = x.clone().requires_grad_(True)
    result = attribution(data, [{"y": [target], **conditions}], EpsilonPlusFlat())
    return result.heatmap.detach()


def relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("layer", CONVS)
def test_a_channel_conditional_heatmap_equals_zennit_crps(model, layer):
    module, path, x = model
    full = rulegraph.explain(str(path), "epsilon-plus-flat", {"pixel_values": x}, dtype=torch.float64, at="op Conv")
    node = full.at()[CONVS.index(layer)].node
    channels = module[int(layer)].out_channels
    target = full.target[0]
    whole = full.boundary["pixel_values"].sum(1)
    assert relative(whole, crp_heatmap(module, x, target, {})) <= RTOL
    for chosen in ([0], [1, 2], list(range(channels))):
        ours = rulegraph.explain(str(path), "epsilon-plus-flat", {"pixel_values": x}, dtype=torch.float64,
                                 condition=f"name {node}:channels={','.join(map(str, chosen))}")
        theirs = crp_heatmap(module, x, target, {layer: chosen})
        err = relative(ours.boundary["pixel_values"].sum(1), theirs)
        print(f"conv {layer} channels {chosen}: max relative error {err:.2e}")
        assert err <= RTOL
        if len(chosen) < channels:          # a condition that leaves channels out changes the map
            assert relative(theirs, whole) > 1e-3


def test_two_layers_conditioned_together_equal_zennit_crps(model):
    """CRP's multi-layer conditioning: channels of the second and the third convolution at once (zennit-crp takes
    the layers of a condition last first)."""
    module, path, x = model
    full = rulegraph.explain(str(path), "epsilon-plus-flat", {"pixel_values": x}, dtype=torch.float64, at="op Conv")
    nodes = [c.node for c in full.at()]
    ours = rulegraph.explain(str(path), "epsilon-plus-flat", {"pixel_values": x}, dtype=torch.float64,
                             condition=[f"name {nodes[1]}:channels=1,4", f"name {nodes[2]}:channels=0,3"])
    theirs = crp_heatmap(module, x, full.target[0], {"6": [0, 3], "3": [1, 4]})
    err = relative(ours.boundary["pixel_values"].sum(1), theirs)
    print(f"conv 3 channels 1,4 and conv 6 channels 0,3: max relative error {err:.2e}")
    assert err <= RTOL


@pytest.mark.parametrize("layer", CONVS)
def test_channel_wise_maps_of_one_walk_equal_zennit_crps(model, layer):
    """``channels=each``: every channel's conditional map of a layer from one batched walk, against zennit-crp
    explaining the same list of conditions in one call (its batch of conditions)."""
    module, path, x = model
    full = rulegraph.explain(str(path), "epsilon-plus-flat", {"pixel_values": x}, dtype=torch.float64, at="op Conv")
    node, target = full.at()[CONVS.index(layer)].node, full.target[0]
    ours = rulegraph.explain(str(path), "epsilon-plus-flat", {"pixel_values": x}, dtype=torch.float64,
                             condition=f"name {node}:channels=each")
    channels = module[int(layer)].out_channels
    attribution = crp.CondAttribution(module, no_param_grad=True)
    theirs = attribution(x.clone().requires_grad_(True), [{"y": [target], layer: [c]} for c in range(channels)],
                         EpsilonPlusFlat()).heatmap.detach()
    assert len(ours) == channels == theirs.shape[0]
    scale = full.boundary["pixel_values"].sum(1).abs().max()         # a channel no relevance reaches is all zero
    for c, e in enumerate(ours):
        err = float((e.boundary["pixel_values"].sum(1)[0] - theirs[c]).abs().max() / scale)
        print(f"conv {layer} channel {c} (one walk of {channels}): max relative error {err:.2e}")
        assert err <= RTOL
