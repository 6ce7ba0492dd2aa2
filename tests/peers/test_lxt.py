"""rulegraph's ``attnlrp`` rule set on a BERT export against LXT 2.1's AttnLRP (its efficient,
Gradient×Input implementation) on the same weights, float64.

LXT patches ``transformers``' BERT classes and ``torch.nn.LayerNorm`` globally, so it runs in
a subprocess. Runs in the peers environment (``.peers/bin/python -m pytest -m peer``).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tiny

pytestmark = pytest.mark.peer
pytest.importorskip("lxt")
pytest.importorskip("transformers")

from rulegraph import explain  # noqa: E402

RTOL = 1e-5

LXT_SCRIPT = r"""
import sys
import torch
from lxt.efficient import monkey_patch
from transformers.models.bert import modeling_bert
monkey_patch(modeling_bert, verbose=False)
sys.path.insert(0, sys.argv[1])
import tiny
folder = sys.argv[2]
state = torch.load(f"{folder}/state.pt")
model = tiny.build("bert")
model.load_state_dict(state["weights"])
model = model.double().eval()
feeds = state["feeds"]
embeds = model.bert.embeddings.word_embeddings(feeds["input_ids"]).detach().requires_grad_(True)
logits = model(inputs_embeds=embeds, attention_mask=feeds["attention_mask"],
               token_type_ids=feeds["token_type_ids"]).logits
picked = logits[torch.arange(len(state["target"])), state["target"]]
picked.sum().backward()
torch.save({"relevance": (embeds * embeds.grad).detach(), "logits": logits.detach()}, f"{folder}/lxt.pt")
"""


def test_attnlrp_equals_lxt_on_bert(tmp_path):
    model = tiny.build("bert").eval()
    path = tiny.onnx(model, tmp_path / "bert.onnx")
    feeds = tiny.token_inputs(batch=2, length=8, pad=2)
    ours = explain(str(path), "attnlrp", feeds, dtype=torch.float64)
    torch.save({"weights": model.state_dict(), "feeds": feeds, "target": torch.tensor(ours.target)},
               tmp_path / "state.pt")
    subprocess.run([sys.executable, "-c", LXT_SCRIPT, str(Path(tiny.__file__).parent), str(tmp_path)],
                   check=True, capture_output=True)
    theirs = torch.load(tmp_path / "lxt.pt")
    torch.testing.assert_close(ours.output_tensor.double(), theirs["logits"], rtol=1e-9, atol=1e-12)
    got = ours.boundary["input_ids"].double()
    reference = theirs["relevance"]
    err = float((got - reference).abs().max() / reference.abs().max())
    print(f"bert attnlrp vs LXT: max relative error {err:.2e}")
    assert err <= RTOL
