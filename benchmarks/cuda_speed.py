"""Time per explanation on a GPU: rulegraph vs torch autograd GI, MiniLM-shaped BERT.

    python benchmarks/cuda_speed.py [--device cuda] [--lengths 94 512] [--batch 1]

The demo model is not needed: a BERT with the demo's shape (6 layers, hidden 384,
12 heads, 2 classes) and random weights is exported to ONNX in a temporary folder.
Timings use CUDA synchronisation around each call; median of interleaved rounds.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import rulegraph
from rulegraph.exporters import HFClassifier, export_onnx


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lengths", type=int, nargs="+", default=[94, 512])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    config = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                        attn_implementation="eager")
    module = BertForSequenceClassification(config).eval()
    folder = Path(tempfile.mkdtemp())
    example = {"input_ids": torch.randint(1000, 2000, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long),
               "token_type_ids": torch.zeros(2, 8, dtype=torch.long)}
    path = export_onnx(HFClassifier(module), example, folder / "model.onnx")
    graph = rulegraph.load(path)
    rules = rulegraph.RuleSet.load("lrp-ah-ln")
    gpu_module = module.to(args.device)

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    print(f"device {torch.cuda.get_device_name() if args.device.startswith('cuda') else args.device}, "
          f"torch {torch.__version__}, batch {args.batch}")
    print("| tokens | method | median ms |\n|---:|---|---:|")
    for length in args.lengths:
        feeds = {"input_ids": torch.randint(1000, 2000, (args.batch, length)),
                 "attention_mask": torch.ones(args.batch, length, dtype=torch.long),
                 "token_type_ids": torch.zeros(args.batch, length, dtype=torch.long)}
        on_device = {k: v.to(args.device) for k, v in feeds.items()}

        def torch_gi():
            words = gpu_module.bert.embeddings.word_embeddings(on_device["input_ids"]).detach().requires_grad_(True)
            logits = gpu_module(inputs_embeds=words, attention_mask=on_device["attention_mask"],
                                token_type_ids=on_device["token_type_ids"]).logits
            logits.gather(1, logits.argmax(1, keepdim=True)).sum().backward()
            return (words * words.grad).sum(-1)

        methods = {
            "rulegraph forward": lambda: rulegraph.run(graph, feeds, device=args.device),
            "rulegraph explain lrp-ah-ln (with audit)": lambda: rulegraph.explain(graph, rules, feeds, device=args.device),
            "rulegraph explain lrp-ah-ln (no audit)":
                lambda: rulegraph.explain(graph, rules, feeds, device=args.device, audit=False),
            "torch autograd GI": torch_gi,
        }
        times = {k: [] for k in methods}
        for fn in methods.values():
            fn(), fn()
        for _ in range(args.rounds):
            for name, fn in methods.items():
                sync()
                start = time.perf_counter()
                fn()
                sync()
                times[name].append((time.perf_counter() - start) * 1e3)
        for name, ts in times.items():
            print(f"| {length} | {name} | {statistics.median(ts):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
