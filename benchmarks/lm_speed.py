"""Time per AttnLRP explanation of a causal language model: rulegraph against LXT, side by side in one process.

    python benchmarks/lm_speed.py --lxt-python PYTHON [--models gpt2-small llama-100m]
        [--lengths 256 1024 2048] [--rounds 3] [--out benchmarks/results/lm_speed.md]
    python benchmarks/lm_speed.py --lxt-python PYTHON --models tiny --lengths 16 --rounds 1   # checks it runs
    python benchmarks/lm_speed.py --lxt-python PYTHON --keep-freed-memory ...   # glibc reuses freed blocks

The models are :mod:`memory`'s (random weights from ``transformers`` configs, exported by rulegraph's
exporter once under ``--work``). Each (model, length) is one process of ``--lxt-python`` (an environment
where both ``lxt`` and rulegraph import: LXT 2.1 needs transformers 4.x; install rulegraph there with
``pip install --no-deps -e .`` and its runtime requirements), one torch thread, float32, batch 1, which
explains the next token after ``L`` random ids (the predicted one, at the last position) by

* rulegraph ``attnlrp`` on the ONNX export, with its conservation audit (the default) and without, its LM
  head at the explained position only (the default), and with the audit and every position's logits
  (``logits="all"``);
* LXT 2.1's efficient AttnLRP (``lxt.efficient.monkey_patch`` of the model's modeling file, then a
  Gradient×Input backward with the weights' gradients off, :func:`harness.gradient_times_input`), as its
  examples call the model (every position's logits), and with Hugging Face's ``logits_to_keep=1`` (the
  last position's only).

With ``--keep-freed-memory`` the processes run with glibc's malloc told to keep freed memory for reuse
(:data:`KEEP_FREED`): a fresh tensor of attention size then costs no page faults, which otherwise cost
about as much as the op that fills it. Both tools run under it alike.

The calls are interleaved (one of each per round, after a warm-up round), so a busy machine slows them
alike; the table gives the median of the rounds and the ratio of medians to LXT's. Target (issue 29):
rulegraph with the audit ≤ 0.9× LXT.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from harness import REPO, last_json, machine, report
from memory import ids, lxt_arguments, lxt_importable, made


def child(folder: str, length: str, rounds: str) -> None:
    """One (model, length): prints a JSON line of milliseconds per call, by method."""
    import torch
    import transformers
    from lxt.efficient import monkey_patch

    import rulegraph
    from harness import gradient_times_input, interleave
    torch.set_num_threads(1)
    path = Path(folder)
    graph = rulegraph.load(path / "export" / "model.onnx")
    config = transformers.AutoConfig.from_pretrained(path / "hf")
    feeds = ids(int(length), config.vocab_size)
    monkey_patch(__import__(f"transformers.models.{config.model_type}.modeling_{config.model_type}",
                            fromlist=["_"]), verbose=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(path / "hf", attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    def lxt(keep: int):
        return gradient_times_input(
            model, lambda: model.get_input_embeddings()(feeds["input_ids"]),
            lambda w: model(inputs_embeds=w, attention_mask=feeds["attention_mask"], use_cache=False,
                            logits_to_keep=keep).logits,
            lambda logits: logits[0, -1].max())
    times = interleave({
        "rulegraph": lambda: rulegraph.explain(graph, "attnlrp", feeds, audit=True),
        "rulegraph-no-audit": lambda: rulegraph.explain(graph, "attnlrp", feeds, audit=False),
        "rulegraph-all-logits": lambda: rulegraph.explain(graph, "attnlrp", feeds, audit=True, logits="all"),
        "lxt": lxt(0),
        "lxt-last": lxt(1),
    }, int(rounds), warmup=1)
    print(json.dumps(times))


CHILD = "import sys; sys.path.insert(0, {bench!r}); import lm_speed; lm_speed.child(*sys.argv[1:])"
#: glibc malloc settings (environment) that keep freed blocks for reuse instead of returning them to the
#: system: allocations up to 1 GiB come from the heap, which is trimmed only above 2 GiB free
KEEP_FREED = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 31)}
LABELS = {"rulegraph": "rulegraph attnlrp (audit on)", "rulegraph-no-audit": "rulegraph attnlrp (audit off)",
          "rulegraph-all-logits": "rulegraph attnlrp (audit on, logits='all')",
          "lxt": "LXT AttnLRP (efficient, HF)", "lxt-last": "LXT AttnLRP (efficient, HF, logits_to_keep=1)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep-freed-memory", action="store_true",
                    help="run both tools with glibc keeping freed memory for reuse (KEEP_FREED)")
    lxt_arguments(ap, "lm_speed.md")
    args = ap.parse_args()
    versions = lxt_importable(args.lxt_python)
    if not versions:
        sys.exit(f"lm_speed: --lxt-python {args.lxt_python!r} cannot import lxt.efficient")
    rows = []
    for name in args.models:
        made(args.work, name)
        for length in args.lengths:
            run = subprocess.run([args.lxt_python, "-c", CHILD.format(bench=str(REPO / "benchmarks")),
                                  str(args.work / name), str(length), str(args.rounds)],
                                 capture_output=True, text=True,
                                 env={**os.environ, **(KEEP_FREED if args.keep_freed_memory else {})})
            if run.returncode != 0:
                sys.exit(f"lm_speed: {name} at {length} tokens failed: {run.stderr[-2000:]}")
            times = last_json(run.stdout)
            medians = {k: statistics.median(v) for k, v in times.items()}
            print(name, length, {k: round(v) for k, v in medians.items()}, flush=True)
            for key, label in LABELS.items():
                ratio = medians[key] / medians["lxt"]
                rows.append([name, length, label, f"{medians[key] / 1e3:.2f} s",
                             f"{min(times[key]) / 1e3:.2f} s", f"**{ratio:.2f}×**" if key == "rulegraph" else
                             f"{ratio:.2f}×", f"{medians[key] / medians['lxt-last']:.2f}×"])
    allocator = ("glibc malloc keeping freed memory (" + ", ".join(f"{k}={v}" for k, v in KEEP_FREED.items()) + ")"
                 if args.keep_freed_memory else "glibc malloc as configured by default")
    conditions = [
        f"{machine(1)} · float32, batch 1, CPU, one torch thread; {versions}, in the same process; {allocator}.",
        "",
        "Models: random weights from transformers configs (`benchmarks/memory.py`'s), rulegraph on their ONNX "
        "export, LXT on the Hugging Face module (eager attention). Each explains the next token after L random "
        f"ids. {args.rounds} interleaved rounds after a warm-up round; medians, and the ratio of medians to "
        "LXT's as its examples call the model (target: ≤ 0.9× with the audit), and to LXT's with Hugging Face "
        "computing the last position's logits only (`logits_to_keep=1`).",
        "",
        f"`python benchmarks/lm_speed.py --models {' '.join(args.models)} --lengths "
        f"{' '.join(map(str, args.lengths))} --rounds {args.rounds}"
        f"{' --keep-freed-memory' if args.keep_freed_memory else ''}`",
    ]
    report(args.out, "AttnLRP time on causal language models: rulegraph and LXT", conditions,
           ["model", "tokens", "method", "median", "fastest", "vs LXT", "vs LXT, last logits only"], rows)


if __name__ == "__main__":
    main()
