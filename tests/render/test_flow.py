"""The relevance graph drawn (rulegraph.render.flow): the SVG holds a disc per (layer, position) and the strongest
edges, titled with their figures; the pages of a GPT-2- and a BERT-style model, loaded in headless Chromium,
are laid out within the window and not blank; the PNG is a picture."""
from __future__ import annotations

import re

import pytest
import torch

import rulegraph
import tiny
from browser import needs_chromium, open_page, screenshot_is_not_blank
from rulegraph.layergraph import TOP_EDGES
from rulegraph.render import flow

TEXT = "w1 w2 w3 w4 w5"


@pytest.fixture(scope="module")
def graphs(tmp_path_factory, bert_onnx):
    folder = tmp_path_factory.mktemp("flow")
    lm = tiny.onnx(tiny.causal_lm("gpt2"), folder / "lm" / "model.onnx", names=("input_ids", "attention_mask"))
    tiny.lm_tokenizer().save(str(lm.parent / "tokenizer.json"))
    return {name: rulegraph.explain(model, "attnlrp", text=TEXT, dtype=torch.float64, graph=True).graph
            for name, model in (("gpt2", lm), ("bert", bert_onnx))}


def test_the_svg_draws_each_node_and_the_strongest_edges(graphs):
    for name, g in graphs.items():
        picture = flow.svg(g)
        layers, positions = g.nodes.shape[1:]
        assert picture.count('<circle class="node"') == layers * positions, name
        edges = re.findall(r'<line class="edge"[^>]*stroke-width="([\d.]+)"', picture)
        assert 0 < len(edges) <= TOP_EDGES * len(g.edges)
        assert max(map(float, edges)) == pytest.approx(7.5)          # the strongest edge at full width
        strongest = max(g.paths(), key=lambda p: abs(p["relevance"]))
        assert f"{strongest['relevance']:+.4g}</title></line>" in picture
        for token in g.names():
            assert f">{token.strip()}</text>" in picture


@needs_chromium
def test_the_pages_lay_out_in_chromium(graphs, tmp_path):
    for name, g in graphs.items():
        report, shot = open_page(flow.page(g, name), tmp_path, f"flow-{name}")
        seen = screenshot_is_not_blank(shot)
        assert seen["inked"] > 0.02 and seen["colours"] > 20, (name, seen)
        assert report["width"] <= report["viewport"] and report["page"]["tables"] == 1, (name, report)


def test_the_png_is_drawn(graphs, tmp_path):
    from PIL import Image
    from rulegraph.render.figure import save
    path = save(flow.figure(graphs["gpt2"]), tmp_path / "g.png")
    with Image.open(path) as picture:
        assert picture.size[0] > 300 and len(picture.getcolors(1 << 16) or []) > 20
