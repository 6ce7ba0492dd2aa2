"""Linear decomposition, rulegraph against PyDec on the same model, side by side in one run.

    .peers/bin/python benchmarks/decomposition_speed.py [--lengths 94 512] [--rounds 3]
        [--out benchmarks/results/decomposition_speed.md]

Runs in the peers environment (``bash benchmarks/peers/setup.sh``: PyDec 0.3.0 beside
rulegraph). The model is a BERT of MiniLM-L6 size (6 layers, hidden 384, 12 heads,
FFN 1536) with ReLU activations and random weights, built by ``transformers`` and
exported to ONNX for rulegraph; PyDec runs the same weights through a hand-written
forward on its ``Composition`` API (:func:`pydec_bert` — PyDec cannot wrap HF's
``BertModel``). Both decompose the explained logit with signed α (PyDec's default
``affine`` algorithm; rulegraph ``--alpha signed``), per-token groups, float32,
batch 1. Rows per length: torch forward (the floor), PyDec, rulegraph carrying all
T+1 components through the graph (``mode="components"``) and rulegraph's linearized
pass (one component + one backward, the default for signed α), both with their
per-node reconstruction audit, and the floor of carrying components: the matrix products alone
(:func:`component_products`), which PyDec and rulegraph's components mode both must compute. Each
method and length runs in its own
process so the peak resident memory (``ru_maxrss``) is its own; the times are the
median of ``--rounds`` runs after one warm-up.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from harness import cpu_name

import torch

REPO = Path(__file__).resolve().parents[1]
MINILM = dict(hidden=384, layers=6, heads=12, ffn=1536, vocab=1000, positions=512)


def relu_bert(seed: int = 0, size: dict = MINILM):
    """A random-weight ``BertForSequenceClassification`` with ReLU activations, in eval mode."""
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=size["vocab"], hidden_size=size["hidden"], num_hidden_layers=size["layers"],
                        num_attention_heads=size["heads"], intermediate_size=size["ffn"],
                        max_position_embeddings=size["positions"], hidden_act="relu", attn_implementation="eager")
    return BertForSequenceClassification(config).eval()


def export(model, path: Path) -> Path:
    from rulegraph.exporters import HFClassifier, export_onnx
    ids = torch.randint(5, model.config.vocab_size, (2, 8))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return export_onnx(HFClassifier(model), example, path, overwrite=True)


@torch.no_grad()
def pydec_bert(model, input_ids, attention_mask, token_type_ids):
    """The logits of a ReLU ``BertForSequenceClassification`` as a PyDec ``Composition``:
    one component per token (its word + token-type embedding), position embeddings and
    biases in PyDec's residual (the bias component); attention probabilities and
    LayerNorm std computed from the recovered values (coefficients)."""
    import pydec
    import pydec.nn.functional as PF

    bert, emb = model.bert, model.bert.embeddings
    batch, length = input_ids.shape
    inputs = emb.word_embeddings(input_ids) + emb.token_type_embeddings(token_type_ids)
    eye = torch.eye(length, dtype=inputs.dtype)
    components = eye[:, None, :, None] * inputs[None]
    positions = emb.position_embeddings.weight[:length].detach().expand_as(inputs).contiguous()
    c = pydec.Composition(components.detach(), positions)

    def layer_norm(c, module):
        return PF.layer_norm(c, module.normalized_shape, module.weight, module.bias, module.eps)

    c = layer_norm(c, emb.LayerNorm)
    blocked = (1.0 - attention_mask[:, None, None, :].to(inputs.dtype)) * torch.finfo(inputs.dtype).min
    for layer in bert.encoder.layer:
        att = layer.attention.self
        heads, size = att.num_attention_heads, att.attention_head_size
        x = c.c_sum()
        q = att.query(x).view(batch, length, heads, size).transpose(1, 2)
        k = att.key(x).view(batch, length, heads, size).transpose(1, 2)
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(size) + blocked, dim=-1)
        v = PF.linear(c, att.value.weight, att.value.bias).view(batch, length, heads, size).transpose(1, 2)
        context = (probs @ v).transpose(1, 2).reshape(batch, length, heads * size)
        out = layer.attention.output
        c = layer_norm(PF.linear(context, out.dense.weight, out.dense.bias) + c, out.LayerNorm)
        hidden = PF.relu(PF.linear(c, layer.intermediate.dense.weight, layer.intermediate.dense.bias))
        c = layer_norm(PF.linear(hidden, layer.output.dense.weight, layer.output.dense.bias) + c,
                       layer.output.LayerNorm)
    pooled = PF.linear(c[:, 0], bert.pooler.dense.weight, bert.pooler.dense.bias).tanh()
    return PF.linear(pooled, model.classifier.weight, model.classifier.bias)


def component_products(model, length: int):
    """The matrix products that carrying ``length + 1`` components through ``model`` takes, as a function
    to time: per layer the value and output projections and both FFN layers on [components × positions,
    features], and the probabilities times the values of every component. Nothing else: the floor under
    any method that carries every component through the layers (the same products, in the same shapes,
    in both PyDec and rulegraph's components mode)."""
    groups, hidden = length + 1, model.config.hidden_size
    heads, ffn = model.config.num_attention_heads, model.config.intermediate_size
    g = torch.Generator().manual_seed(0)
    narrow = torch.randn(groups * length, hidden, generator=g)
    wide = torch.randn(groups * length, ffn, generator=g)
    probs = torch.softmax(torch.randn(1, heads, length, length, generator=g), -1)
    stacked = torch.randn(1, heads, length, groups * (hidden // heads), generator=g)
    weights = [(layer.attention.self.value.weight.T, layer.attention.output.dense.weight.T,
                layer.intermediate.dense.weight.T, layer.output.dense.weight.T) for layer in model.bert.encoder.layer]

    def products():
        for value, out, up, down in weights:
            narrow @ value, probs @ stacked, narrow @ out, narrow @ up, wide @ down
    return products


def feeds(length: int, vocab: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (1, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def measure(method: str, length: int, rounds: int, model_path: Path) -> dict:
    """Time one method at one length in this process; returns seconds per run and peak RSS."""
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    model = relu_bert()
    x = feeds(length, MINILM["vocab"])
    if method == "forward":
        def fn():
            with torch.no_grad():
                return model(**x).logits
    elif method == "component products":
        fn = component_products(model, length)
    elif method == "pydec":
        def fn():
            return pydec_bert(model, **x)
    else:
        import rulegraph
        graph = rulegraph.load(model_path)
        mode = method.split()[-1]

        def fn():
            return rulegraph.explain(graph, "decomposition", x, alpha="signed", mode=mode)
    if rounds > 1:     # a warm-up, except for the minute-long runs measured once
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def agreement(length: int, model_path: Path, mode: str) -> float:
    """Largest |rulegraph − PyDec| over the group contributions, relative to the largest |contribution|."""
    import rulegraph
    model, x = relu_bert(), feeds(length, MINILM["vocab"])
    e = rulegraph.explain(rulegraph.load(model_path), "decomposition", x, alpha="signed", dtype=torch.float64, mode=mode)
    ours = torch.tensor([g["score"] for g in e.extra["decomposition"]["groups"]], dtype=torch.float64)
    theirs = pydec_bert(model.double(), **x).components[:, 0, e.target[0]]
    return float((ours - theirs).abs().max() / theirs.abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[94, 512])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=["forward", "component products", "pydec",
                                                         "rulegraph components", "rulegraph linearized"])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "decomposition_speed.md")
    parser.add_argument("--measure", nargs=3, metavar=("METHOD", "LENGTH", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # a child process: one method at one length
        method, length, model_path = args.measure
        print(json.dumps(measure(method, int(length), args.rounds, Path(model_path))))
        return
    import pydec
    import transformers
    folder = Path(tempfile.mkdtemp())
    model_path = export(relu_bert(), folder / "relu-bert.onnx")
    rows = []
    for length in args.lengths:
        for method in args.methods:
            rounds = 1 if (method in ("pydec", "rulegraph components", "component products") and length > 256) \
                else args.rounds
            out = subprocess.run([sys.executable, __file__, "--rounds", str(rounds), "--measure", method, str(length),
                                  str(model_path)], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(out.stderr)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append((length, method, result))
            print(f"T={length:4d}  {method:16s} {result['seconds'] * 1e3:10.1f} ms   peak {result['peak_gib']:.2f} GiB",
                  flush=True)
    check = {mode: agreement(min(args.lengths), model_path, mode) for mode in ("components", "linearized")}
    print(f"agreement with PyDec (float64, T={min(args.lengths)}): max rel. difference {check}")
    lines = [
        "# Linear decomposition: rulegraph vs PyDec",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `benchmarks/decomposition_speed.py` on "
        f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, PyDec {getattr(pydec, '__version__', '0.3.0')}.",
        "",
        "Model: BERT of MiniLM-L6 size (6 layers, hidden 384, 12 heads, FFN 1536), ReLU, random weights; "
        "per-token groups (T+1 components with the bias), signed α, float32, batch 1. Each cell runs in its own "
        "process; time = median of the rounds after a warm-up (one cold round for the minute-long cells), peak = that process's maximum resident memory "
        "(model and libraries included).",
        "",
        "| tokens | method | time | × forward | peak memory |",
        "|---:|---|---:|---:|---:|",
    ]
    base = {length: r["seconds"] for length, m, r in rows if m == "forward"}
    for length, method, r in rows:
        ratio = f"{r['seconds'] / base[length]:.0f}×" if length in base else "–"
        lines.append(f"| {length} | {method} | {r['seconds'] * 1e3:.1f} ms | {ratio} | {r['peak_gib']:.2f} GiB |")
    times = {(length, m): r["seconds"] for length, m, r in rows}
    for length in args.lengths:
        if (length, "pydec") in times:
            shares = ", ".join(f"{m} **{times[length, m] / times[length, 'pydec']:.2f}×**" for m in
                               ("rulegraph components", "rulegraph linearized", "component products")
                               if (length, m) in times)
            lines += ["", f"T={length}, against PyDec (target ≤ 0.5× with all components): {shares}."]
    lines += ["", "The component products are the matrix products alone, which carrying every component takes "
                  "whatever the method: a floor under any components-mode implementation that uses torch's "
                  "matrix products on this machine."]
    lines += ["", f"Agreement (float64, T={min(args.lengths)}): largest |rulegraph − PyDec| over the per-token "
                  f"contributions to the logit, relative to the largest contribution: components "
                  f"**{check['components']:.1e}**, linearized **{check['linearized']:.1e}**.", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
