"""Zero token embeddings on causal LMs (GPT-2, and Llama style with GQA and rotary positions): the
``zero`` removal of the model runner against Hugging Face's ``inputs_embeds`` with zero rows, and
leave-one-out on a causal LM (each mode) against the same forwards done by hand."""
from __future__ import annotations

import copy

import pytest
import torch

from rulegraph.loaders import load
from rulegraph.methods import TokenModel, Tokens, Vocab, explain_with
from rulegraph.tokens import ZERO

IDS = [7, 31, 12, 55, 40, 9, 23]
UNK = 4


@pytest.fixture(scope="module")
def lm(causal_lm):
    module, path = causal_lm
    return copy.deepcopy(module).double().eval(), path


def next_logits(module, ids, zero=()):
    """The last position's logits with the token embeddings at ``zero`` set to 0 (``inputs_embeds``)."""
    x = torch.tensor([ids])
    embeds = module.get_input_embeddings()(x).clone()
    embeds[0, list(zero)] = 0
    with torch.no_grad():
        return module(inputs_embeds=embeds, attention_mask=torch.ones_like(x)).logits[0, -1]


def test_the_runner_feeds_zero_embeddings_as_hugging_face_inputs_embeds_do(lm):
    module, path = lm
    runner = TokenModel(load(path), dtype=torch.float64, zeroed=True)
    seqs = [Tokens(tuple(IDS)), Tokens(tuple(IDS)).remove([1, 4], ZERO), Tokens(tuple(IDS[:4])).remove([0], ZERO)]
    got = runner(seqs)
    for row, (ids, zero) in zip(got, [(IDS, ()), (IDS, (1, 4)), (IDS[:4], (0,))]):
        # float64 runs; the export keeps a few float32 constants (rotary frequencies, the attention scale)
        assert torch.allclose(row, next_logits(module, ids, zero), rtol=0, atol=1e-5 * float(row.abs().max()))
    assert not torch.allclose(got[0], got[1])


@pytest.mark.parametrize("mode", ["zero", "delete", "unk"])
def test_leave_one_out_on_a_causal_lm_removes_each_token_before_the_explained_position(lm, mode):
    """Explained at position 4 (of 7): the next-token logit of the argmax there, minus the same logit
    with token i removed (i ≤ 4), from sequences ending at position 4; later tokens score 0."""
    module, path = lm
    x = torch.tensor([IDS])
    e = explain_with(path, "loo", {"input_ids": x, "attention_mask": torch.ones_like(x)}, position=4,
                     dtype=torch.float64, vocab=Vocab(pad=0, unk=UNK), mode=mode)
    prefix = IDS[:5]
    full = next_logits(module, prefix)
    y = int(full.argmax())
    assert e.target == [y]
    expected = []
    for i in range(5):
        if mode == "zero":
            removed = next_logits(module, prefix, zero=(i,))
        elif mode == "delete":
            removed = next_logits(module, prefix[:i] + prefix[i + 1:])
        else:
            removed = next_logits(module, prefix[:i] + [UNK] + prefix[i + 1:])
        expected.append(float(full[y] - removed[y]))
    scores = torch.as_tensor(e.scores("input_ids")).flatten().tolist()
    assert scores[5:] == [0, 0]
    assert scores[:5] == pytest.approx(expected, abs=1e-5 * max(map(abs, expected)))


@pytest.mark.parametrize("method", ["attention", "rollout"])
def test_attention_methods_on_a_causal_lm_read_the_row_of_the_explained_position(lm, method):
    """Not row 0 (a classifier's [CLS]), which in a causal model attends to itself only."""
    module, path = lm
    x = torch.tensor([IDS])
    e = explain_with(path, method, {"input_ids": x, "attention_mask": torch.ones_like(x)}, position=4,
                     dtype=torch.float64)
    with torch.no_grad():
        attentions = [a[0].mean(0) for a in module(input_ids=x, output_attentions=True).attentions]
    if method == "attention":
        expected = attentions[-1][4]
    else:       # Abnar & Zuidema: 0.5·A + 0.5·I per block, rows normalised, multiplied through
        r = torch.eye(len(IDS), dtype=torch.float64)
        for a in attentions:
            a = 0.5 * a + 0.5 * torch.eye(len(IDS), dtype=torch.float64)
            r = (a / a.sum(-1, keepdim=True)) @ r
        expected = r[4]
    scores = torch.as_tensor(e.scores("input_ids"), dtype=torch.float64).flatten()
    assert torch.allclose(scores, expected, atol=1e-6) and scores[5:].abs().max() < 1e-12
