"""Time per explanation on a GPU: rulegraph against a fair torch autograd Gradient×Input, side by side.

    python benchmarks/cuda_speed.py [--device cuda] [--lengths 94 128 512] [--lm-lengths 256 1024]
        [--rounds 20] [--work .cache/bench-models] [--out benchmarks/results/cuda_speed.md]

Two models with random weights, neither needing a download:

* a classifier of the demo's shape (BERT, 6 layers, hidden 384, 12 heads, 2 classes), exported to ONNX
  here: the forward, ``lrp-ah-ln`` and ``attnlrp`` with the conservation audit and without, each run by the
  interpreter and replayed (``replay=True``: traced once per input shape, on a GPU replayed as CUDA graphs;
  the first call, which traces, timed on its own);
* GPT-2 small (:mod:`memory`'s ``gpt2-small``, exported once under ``--work``): ``attnlrp`` with the
  audit and without, run and replayed, explaining the predicted next token after ``L`` random ids.

The reference is torch autograd Gradient×Input on the HF module with the weights' gradients off
(:func:`harness.gradient_times_input`): one forward and one backward, the least an explanation costs.
float32, batch 1. Each call is wrapped in CUDA synchronisation; calls are interleaved (one of each per
round, after two warm-up rounds); the table gives the median, the minimum and the ratio of medians to
the reference. LXT is not compared here: LXT 2.1 needs transformers 4.x.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from harness import REPO, demo_shaped_bert, gradient_times_input, interleave, machine, report

import rulegraph


def synchronised(call, device: str):
    """``call`` followed by a CUDA synchronisation, so its time is the GPU's work and not its queueing."""
    if not device.startswith("cuda"):
        return call

    def timed():
        out = call()
        torch.cuda.synchronize()
        return out
    return timed


def rows_of(times: dict[str, list[float]], model: str, length: int, reference: str) -> list[list]:
    base = statistics.median(times[reference])
    return [[model, length, name, f"{statistics.median(ts):.2f}", f"{min(ts):.2f}",
             f"{statistics.median(ts) / base:.2f}×"] for name, ts in times.items()]


def classifier(args) -> list[list]:
    module, path = demo_shaped_bert()
    graph = rulegraph.load(path)
    on_device = module.to(args.device)
    rows = []
    for length in args.lengths:
        feeds = {"input_ids": torch.randint(1000, 2000, (1, length)),
                 "attention_mask": torch.ones(1, length, dtype=torch.long),
                 "token_type_ids": torch.zeros(1, length, dtype=torch.long)}
        device_feeds = {k: v.to(args.device) for k, v in feeds.items()}
        gi = gradient_times_input(
            on_device, lambda: on_device.bert.embeddings.word_embeddings(device_feeds["input_ids"]),
            lambda words: on_device(inputs_embeds=words, attention_mask=device_feeds["attention_mask"],
                                    token_type_ids=device_feeds["token_type_ids"]).logits,
            lambda logits: logits.gather(1, logits.argmax(1, keepdim=True)).sum())
        calls = {"torch autograd GI": gi, "rulegraph forward": lambda: rulegraph.run(graph, feeds, device=args.device)}
        for rules in ("lrp-ah-ln", "attnlrp"):
            for audit in (True, False):
                for replay in (False, True):
                    calls[f"rulegraph {rules} (audit {'on' if audit else 'off'}{', replayed' if replay else ''})"] = (
                        lambda rules=rules, audit=audit, replay=replay: rulegraph.explain(
                            graph, rules, feeds, device=args.device, audit=audit, replay=replay))
        first = first_calls(calls, args.device)
        times = interleave({k: synchronised(c, args.device) for k, c in calls.items()}, args.rounds)
        rows += rows_of(times, "BERT 6×384 (MiniLM shape)", length, "torch autograd GI") + \
            [["BERT 6×384 (MiniLM shape)", length, f"{k}: first call (traced{captured(args.device)})",
              f"{t:.2f}", f"{t:.2f}", ""] for k, t in first.items()]
    return rows


def first_calls(calls: dict, device: str) -> dict[str, float]:
    """The replayed calls' first call each (ms): the forward and the walk traced (and captured) for the shape."""
    first = {}
    for key, call in calls.items():
        if "replayed" in key:
            start = time.perf_counter()
            synchronised(call, device)()
            first[key] = (time.perf_counter() - start) * 1000
    return first


def captured(device: str) -> str:
    return " and captured as CUDA graphs" if device.startswith("cuda") else ""


def language_model(args) -> list[list]:
    import transformers
    from memory import MODELS, ids, make
    make(args.work, "gpt2-small")
    graph = rulegraph.load(args.work / "gpt2-small" / "export" / "model.onnx")
    module = getattr(transformers, MODELS["gpt2-small"][1]).from_pretrained(
        args.work / "gpt2-small" / "hf", attn_implementation="eager").eval().to(args.device)
    rows = []
    for length in args.lm_lengths:
        feeds = ids(length, MODELS["gpt2-small"][2]["vocab_size"])
        device_feeds = {k: v.to(args.device) for k, v in feeds.items()}
        gi = gradient_times_input(
            module, lambda: module.transformer.wte(device_feeds["input_ids"]),
            lambda words: module(inputs_embeds=words, attention_mask=device_feeds["attention_mask"]).logits,
            lambda logits: logits[0, -1].max())
        calls = {"torch autograd GI": gi}
        for audit in (True, False):
            for replay in (False, True):
                calls[f"rulegraph attnlrp (audit {'on' if audit else 'off'}{', replayed' if replay else ''})"] = (
                    lambda audit=audit, replay=replay: rulegraph.explain(graph, "attnlrp", feeds, device=args.device,
                                                                         audit=audit, replay=replay))
        first = first_calls(calls, args.device)
        times = interleave({k: synchronised(c, args.device) for k, c in calls.items()}, args.rounds)
        rows += rows_of(times, "GPT-2 small (random weights)", length, "torch autograd GI") + \
            [["GPT-2 small (random weights)", length, f"{k}: first call (traced{captured(args.device)})",
              f"{t:.2f}", f"{t:.2f}", ""] for k, t in first.items()]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lengths", type=int, nargs="+", default=[94, 128, 512])
    parser.add_argument("--lm-lengths", type=int, nargs="*", default=[256, 1024])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--work", type=Path, default=REPO / ".cache" / "bench-models")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "cuda_speed.md")
    args = parser.parse_args(argv)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    rows = classifier(args) + (language_model(args) if args.lm_lengths else [])
    report(args.out, "Time per explanation on a GPU" if args.device.startswith("cuda") else
           f"Time per explanation on the {args.device.upper()}",
           [f"{machine()} · {device} · {sys.version.split()[0]}",
            f"float32, batch 1, median and minimum of {args.rounds} interleaved rounds (ms), each call synchronised; "
            "ratio: median over the reference's."],
           ["model", "tokens", "method", "median ms", "min ms", "vs autograd GI"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
