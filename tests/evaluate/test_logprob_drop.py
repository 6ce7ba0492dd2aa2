"""The log-probability drop against its closed form on the bag-of-words model (closed_form.py), and
through ``rulegraph evaluate`` on a random-weight GPT-2 LM head against a reference computed by hand
with the Hugging Face module (autograd Gradient×Input, tokens removed, next-token log-probabilities)."""
from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

import tiny
from closed_form import REMOVAL, case, ideal, model, p_target
from rulegraph.cli import main
from rulegraph.evaluate import metrics as M

TEXT = "w5 w17 w9 w30 w11 w41 w23 w8"
GRID = (0, 25, 50)
UNK = 4


def test_logprob_drop_matches_the_closed_form():
    c = case()
    order = ideal(c)
    # counts ⌊k·n/100 + ½⌋ with n = 10: 0, 1, 2
    expected = np.mean([math.log(p_target(c, [])) - math.log(p_target(c, order[:round(k / 10)])) for k in (0, 10, 20)])
    result = M.logprob_drop(model, c, REMOVAL, k_max=20, k_step=10)
    assert result.value == pytest.approx(expected, abs=1e-12)
    assert len(result.curve) == 3 and result.curve[0] == 0
    assert M.logprob_drop(model, c, REMOVAL, grid=(10,)).value == pytest.approx(
        math.log(p_target(c, [])) - math.log(p_target(c, order[:1])), abs=1e-12)


def test_logprob_drop_is_off_by_default():
    assert "logprob-drop" in M.METRICS and "logprob-drop" not in M.defaults()


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A tiny GPT-2 LM head (float64 copy) exported, and a plain word-level tokenizer.json beside it
    (no special tokens: every context token is removable)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    module = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny.VOCAB), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                        attn_implementation="eager")).eval()
    folder = tmp_path_factory.mktemp("lm")
    path = tiny.onnx(module, folder / "lm.onnx", names=("input_ids", "attention_mask"))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(tiny.VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    return copy.deepcopy(module).double(), path


def _reference(module) -> float:
    """By hand: y = the predicted next token; G×I of its logit at the last position; remove (→ [UNK])
    the ⌊k·n + ½⌋ highest-scored tokens; mean over the grid of log p(y|x) − log p(y|x̃ᵏ)."""
    ids = torch.tensor([[tiny.VOCAB.index(w) for w in TEXT.split()]])
    n = ids.shape[1]

    def next_logp(x):
        with torch.no_grad():
            return module(input_ids=x).logits[0, -1].log_softmax(-1)

    y = int(next_logp(ids).argmax())
    embeddings = module.get_input_embeddings()(ids).detach().requires_grad_(True)
    module(inputs_embeds=embeddings).logits[0, -1, y].backward()
    scores = (embeddings * embeddings.grad).sum(-1)[0].tolist()
    order = sorted(range(n), key=lambda i: (-scores[i], i))
    full = float(next_logp(ids)[y])
    drops = []
    for k in GRID:
        removed = ids.clone()
        removed[0, order[:math.floor(k / 100 * n + 0.5)]] = UNK
        drops.append(full - float(next_logp(removed)[y]))
    return sum(drops) / len(drops)


def test_logprob_drop_of_a_causal_lm_through_evaluate(lm, tmp_path):
    module, path = lm
    data = tmp_path / "texts.csv"
    data.write_text(f"text\n{TEXT}\nw12 w13 w14\n")
    out = tmp_path / "run"
    assert main(["evaluate", str(path), "--data", str(data), "--methods", "gi", "--metrics", "logprob-drop",
                 "--aopc-grid", ",".join(map(str, GRID)), "--removal", "unk", "--dtype", "float64",
                 "--out", str(out), "--quiet"]) == 0
    rows = {r["example"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    # float64 runs; the export keeps a few float32 constants (the attention scale, the mask value)
    assert rows[0]["metrics"]["logprob-drop"] == pytest.approx(_reference(module), rel=1e-7)
    assert rows[0]["curves"]["logprob-drop"][0] == 0
    assert rows[0]["tokens"] == 8 and rows[1]["tokens"] == 3
