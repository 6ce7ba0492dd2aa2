"""What the tests of the attention / layer methods share: the inputs, a run through
:func:`explain_with` in float64, the Hugging Face reference forward and a CLI smoke run."""
from __future__ import annotations

import json

import torch

from rulegraph.cli import main
from rulegraph.methods import explain_with
from reference import as_exported  # noqa: F401  (the methods' tests import it from here)

IDS = torch.tensor([[2, 11, 17, 23, 11, 42, 55, 3], [2, 60, 71, 88, 93, 19, 3, 0]])   # token 11 twice in item 0
MASK = torch.tensor([[1] * 8, [1] * 7 + [0]])


def feeds():
    return {"input_ids": IDS, "attention_mask": MASK, "token_type_ids": torch.zeros_like(IDS)}


def run(model_path, method, **options):
    return explain_with(model_path, method, feeds(), dtype=torch.float64, **options)


def hf(model, **kwargs):
    return model(input_ids=IDS, attention_mask=MASK, token_type_ids=torch.zeros_like(IDS), **kwargs)


def cli_json(capsys, tmp_path, model_path, method, *options):
    """``rulegraph explain MODEL --method NAME [-o k=v…] --json FILE``: exit code and the document."""
    path = tmp_path / f"{method}.json"
    args = ["explain", model_path, "--method", method, *[a for o in options for a in ("-o", o)],
            "-t", "w1 w2 w3 w4", "--json", path]
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 0, err
    return json.loads(path.read_text())
