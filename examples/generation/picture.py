"""The README's generation picture: which prompt tokens each generated token relied on.

    python examples/generation/picture.py [--out docs/generation/random-llama-attnlrp.png]

The model is a Llama-style decoder (RMSNorm, rotary positions, SwiGLU, grouped-query attention)
with RANDOM weights and a small English word vocabulary, saved with ``save_pretrained`` and
exported with ``rulegraph export`` (no download: nothing here is a trained language model, so
the generated words are arbitrary; the picture shows what the command draws, not what a real
model attends to). Each generated token is explained with the ``attnlrp`` rule set.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM

import rulegraph
from rulegraph.cli import main as cli

REPO = Path(__file__).resolve().parents[2]
WORDS = ("<unk> the a of and to in is was it that he she they we you on for with as at by from this his her "
         "their cat dog bird mat house tree river city king queen child man woman sat ran saw found took gave "
         "made went came said because when while after before but or so then there here very old small big "
         "red green blue quiet loud happy sad warm cold night day morning home garden road bridge door window "
         "book letter song story name friend mother father sister brother water fire stone light").split()
PROMPT = "the old king found a small letter on the bridge because"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "generation" / "random-llama-attnlrp.png")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    folder = REPO / ".cache" / "generation-picture"
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    LlamaForCausalLM(config).eval().save_pretrained(folder / "hf")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "hf" / "tokenizer.json"))
    if cli(["export", str(folder / "hf"), str(folder / "export"), "--force"]) != 0:
        return 1
    g = rulegraph.generate(folder / "export" / "model.onnx", "attnlrp", text=PROMPT, max_new_tokens=args.steps)
    figure = g.plot(title="attnlrp, each generated token (columns) — RANDOM-weight Llama-style model, "
                          "not a trained LM")
    figure.savefig(args.out, dpi=100, bbox_inches="tight")
    print(f"generated: {g.continuation!r}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
