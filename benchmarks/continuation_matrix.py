"""The source × target matrix of a given continuation: rulegraph against LXT, time and peak memory.

    python benchmarks/continuation_matrix.py --lxt-python PYTHON [--models gpt2-small llama-100m]
        [--prompt 480] [--steps 32] [--rounds 2] [--out benchmarks/results/continuation_matrix.md]
    python benchmarks/continuation_matrix.py --lxt-python PYTHON --models tiny --prompt 24 --steps 4 --rounds 1

Each explains every token of a ``--steps``-token continuation after a ``--prompt``-token prompt (random ids)
with AttnLRP, each token's logit at the position that predicts it, giving the prompt-and-continuation ×
steps matrix:

* ``rulegraph``: ``rulegraph.generate(…, continuation=…)`` with ``attnlrp`` and its audit: one forward on
  the whole sequence, its LM head at the continuation's positions only, then a walk per step on its values
  (a language model's logits are walked one target at a time: ``passes.relevance.one_at_a_time``), each step
  with its own audit;
* ``LXT, a forward and a backward per token``: what LXT's examples do for each token: the prefix up to
  its position, forward, backward from its logit (LXT 2.1's efficient AttnLRP, ``lxt.efficient.monkey_patch``,
  weight gradients off);
* ``LXT, one forward, a backward per token``: one forward on the whole sequence, then a backward per
  token with ``retain_graph=True``.

The models are :mod:`memory`'s (random weights from ``transformers`` configs; rulegraph on their ONNX
export, LXT on the Hugging Face module, eager attention), float32, one torch thread, batch 1. Every run is
a process of its own (``--lxt-python``: an interpreter where ``lxt`` and rulegraph both import), so its
peak resident memory is its own; the variants alternate round after round, and the table gives the
median time (the explanation alone, after loading) and peak RSS, and their ratios to each LXT variant.
The matrices are compared too: the largest difference from LXT's per-token matrix, relative to its
largest entry. Targets (issue 40): ≤ 0.6× the per-token time, ≤ 0.9× the retained-graph time, peak
memory ≤ 1.2× LXT's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from harness import REPO, last_json, machine, peak_rss, report
from memory import ids, lxt_arguments, lxt_importable, made

CHILD = "import sys; sys.path.insert(0, {bench!r}); import continuation_matrix; continuation_matrix.child(*sys.argv[1:])"
VARIANTS = {"rulegraph": "rulegraph attnlrp, one forward, a walk per token (audit on)",
            "lxt-each": "LXT, a forward and a backward per token",
            "lxt-retain": "LXT, one forward, a backward per token (retain_graph)"}


def child(variant: str, folder: str, prompt: str, steps: str, matrix_out: str) -> None:
    """One run of ``variant``: prints a JSON line with its seconds; writes its matrix to ``matrix_out``."""
    import time
    import torch
    torch.set_num_threads(1)
    path, prompt, steps = Path(folder), int(prompt), int(steps)
    vocab = json.loads((path / "hf" / "config.json").read_text())["vocab_size"]
    sequence = ids(prompt + steps, vocab)["input_ids"]
    cont = sequence[0, prompt:].tolist()
    if variant == "rulegraph":
        import rulegraph
        graph = rulegraph.load(path / "export" / "model.onnx")
        feeds = {"input_ids": sequence[:, :prompt], "attention_mask": torch.ones_like(sequence[:, :prompt])}
        started = time.perf_counter()
        g = rulegraph.generate(graph, "attnlrp", inputs=feeds, continuation=cont)
        seconds = time.perf_counter() - started
        matrix = g.matrix.nan_to_num().T.float()                    # [steps, rows]
        assert max(s.relative_error for s in g.steps) < 1e-4
    else:
        import transformers
        from lxt.efficient import monkey_patch
        config = transformers.AutoConfig.from_pretrained(path / "hf")
        monkey_patch(__import__(f"transformers.models.{config.model_type}.modeling_{config.model_type}",
                                fromlist=["_"]), verbose=False)
        model = transformers.AutoModelForCausalLM.from_pretrained(path / "hf", attn_implementation="eager",
                                                                  dtype=torch.float32).eval()
        model.requires_grad_(False)
        length = prompt + steps - 1
        matrix = torch.zeros(steps, length)
        started = time.perf_counter()
        if variant == "lxt-each":
            for t in range(steps):
                words = model.get_input_embeddings()(sequence[:, :prompt + t]).detach().requires_grad_(True)
                logits = model(inputs_embeds=words, use_cache=False).logits
                logits[0, -1, cont[t]].backward()
                matrix[t, :prompt + t] = (words * words.grad).sum(-1)[0].detach()
        else:
            words = model.get_input_embeddings()(sequence[:, :length]).detach().requires_grad_(True)
            logits = model(inputs_embeds=words, use_cache=False).logits
            for t in range(steps):
                (grad,) = torch.autograd.grad(logits[0, prompt - 1 + t, cont[t]], words, retain_graph=True)
                matrix[t] = (words * grad).sum(-1)[0].detach()
        seconds = time.perf_counter() - started
    torch.save(matrix, matrix_out)
    print(json.dumps({"seconds": seconds}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", type=int, default=480)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    lxt_arguments(ap, "continuation_matrix.md")
    args = ap.parse_args()
    versions = lxt_importable(args.lxt_python)
    if not versions:
        sys.exit(f"continuation_matrix: --lxt-python {args.lxt_python!r} cannot import lxt.efficient")
    import torch
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            made(args.work, name)
            runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    out = Path(scratch) / f"{name}-{variant}.pt"
                    run = peak_rss(CHILD.format(bench=str(REPO / "benchmarks")), variant, str(args.work / name),
                                   str(args.prompt), str(args.steps), str(out), python=args.lxt_python)
                    runs[variant].append({**last_json(run["stdout"]), "peak_gib": run["peak_gib"]})
                    print(name, variant, runs[variant][-1], flush=True)
            matrices = {v: torch.load(Path(scratch) / f"{name}-{v}.pt") for v in VARIANTS}
            reference = matrices["lxt-each"]
            median = {v: statistics.median(r["seconds"] for r in runs[v]) for v in VARIANTS}
            peak = {v: statistics.median(r["peak_gib"] for r in runs[v]) for v in VARIANTS}
            for v, label in VARIANTS.items():
                gap = float((matrices[v] - reference).abs().max() / reference.abs().max())
                rows.append([name, label, f"{median[v]:.1f} s", f"{median[v] / median['lxt-each']:.2f}×",
                             f"{median[v] / median['lxt-retain']:.2f}×", f"{peak[v]:.2f} GiB",
                             f"{peak[v] / peak['lxt-each']:.2f}× / {peak[v] / peak['lxt-retain']:.2f}×",
                             f"{gap:.1e}"])
    report(args.out, f"A {args.steps}-token continuation's matrix after a {args.prompt}-token prompt",
           [f"Measured {machine(1)} · float32, batch 1, one torch thread; {versions}; {args.rounds} rounds, "
            "each run a process of its own, the variants alternating; medians.",
            "Random-weight models (`benchmarks/memory.py`'s); every token of the continuation explained at the "
            "position that predicts it (AttnLRP). Targets (issue 40): ≤ 0.6× LXT per token, ≤ 0.9× LXT with the "
            "graph retained, peak memory ≤ 1.2× LXT's. The last column: the largest difference from LXT's "
            "per-token matrix, relative to its largest entry."],
           ["model", "variant", "time", "vs LXT per token", "vs LXT retained", "peak RSS",
            "memory vs LXT (per token / retained)", "matrix vs LXT"], rows)


if __name__ == "__main__":
    main()
