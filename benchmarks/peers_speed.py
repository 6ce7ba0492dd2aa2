"""Time per explanation, rulegraph against LXT and Zennit, side by side in one run.

    .peers/bin/python benchmarks/peers_speed.py [--rounds 5] [--length 128] [--threads 2]
        [--pairs attnlrp epsilon-gamma-box] [--compiled] [--out benchmarks/results/peers_speed.md]

Runs in the peers environment (``bash benchmarks/peers/setup.sh``); ``--pairs attnlrp`` needs only LXT
(and transformers 4.x). Two pairs:

* AttnLRP on a BERT: rulegraph ``rules/attnlrp.yaml`` on the ONNX export against LXT 2.1
  (its efficient Gradient×Input AttnLRP, ``lxt.efficient.monkey_patch``) on the HF module.
  The model is the demo MiniLM in ``.cache/sentiment-minilm`` (ONNX + HF weights) when it
  exists, else a BERT-base-shaped model with random weights exported here.
* EpsilonGammaBox on torchvision ResNet-18 (random weights, 224×224): rulegraph
  ``rules/epsilon-gamma-box.yaml`` (BatchNorm folded by its canonizer) against Zennit's
  composite with its ResNet canonizer.

float32, batch 1, CPU. Rounds are interleaved (one explanation of each method per round)
after one warm-up of each, so load from other processes falls on all alike; the table
gives the median and the minimum. rulegraph runs with its conservation audit (as the CLI
does) and without (``audit=False``); with ``--compiled`` also replayed with its traces compiled
(``compiled=True``, the audit on), its first call (the trace and TorchInductor's compile) timed apart.
"""
from __future__ import annotations

import argparse
import os
from importlib import metadata
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import interleave, machine

import torch

REPO = Path(__file__).resolve().parents[1]
MINILM = REPO / ".cache" / "sentiment-minilm"
#: per comparison, the peer's distribution and name
PEERS = {"epsilon-gamma-box": ("zennit", "Zennit"), "attnlrp": ("lxt", "LXT")}


def bert_pair(length: int, folder: Path, compiled: bool = False):
    """(rulegraph call, LXT call, description) for AttnLRP on one input of ``length`` tokens."""
    import transformers
    from transformers import BertConfig, BertForSequenceClassification

    import rulegraph
    if (MINILM / "model.onnx").exists() and (MINILM / "hf").exists():
        onnx_path, hf = MINILM / "model.onnx", MINILM / "hf"
        what = "demo MiniLM (6 layers, hidden 384)"
        make = lambda: BertForSequenceClassification.from_pretrained(hf, attn_implementation="eager")  # noqa: E731
    else:
        config = BertConfig(attn_implementation="eager", num_labels=2)     # BERT-base shape
        torch.manual_seed(0)
        state = BertForSequenceClassification(config).eval().state_dict()

        def make():
            m = BertForSequenceClassification(config)
            m.load_state_dict(state)
            return m
        sys.path.insert(0, str(REPO))
        from exporters import HFClassifier, export_onnx
        onnx_path = folder / "bert-base.onnx"
        example = {"input_ids": torch.randint(5, 1000, (1, 16)), "attention_mask": torch.ones(1, 16, dtype=torch.long),
                   "token_type_ids": torch.zeros(1, 16, dtype=torch.long)}
        export_onnx(HFClassifier(make().eval()), example, onnx_path, overwrite=True)
        what = "BERT-base shape, random weights (12 layers, hidden 768)"
    g = torch.Generator().manual_seed(0)
    feeds = {"input_ids": torch.randint(1000, 5000, (1, length), generator=g),
             "attention_mask": torch.ones(1, length, dtype=torch.long),
             "token_type_ids": torch.zeros(1, length, dtype=torch.long)}
    graph = rulegraph.load(str(onnx_path))

    from lxt.efficient import monkey_patch
    from transformers.models.bert import modeling_bert
    monkey_patch(modeling_bert, verbose=False)
    lxt_model = make().eval()
    for p in lxt_model.parameters():
        p.requires_grad_(False)

    def ours(audit: bool):
        return lambda: rulegraph.explain(graph, "attnlrp", feeds, audit=audit)

    def lxt():
        emb = lxt_model.bert.embeddings.word_embeddings(feeds["input_ids"]).requires_grad_(True)
        logits = lxt_model(inputs_embeds=emb, attention_mask=feeds["attention_mask"],
                           token_type_ids=feeds["token_type_ids"]).logits
        logits[0, logits[0].argmax()].backward()
        return (emb * emb.grad).sum(-1)
    calls = {"rulegraph (audit)": ours(True), "rulegraph (no audit)": ours(False)}
    if compiled:
        calls["rulegraph (audit, compiled)"] = lambda: rulegraph.explain(graph, "attnlrp", feeds, compiled=True)
    return {**calls, "LXT": lxt}, f"AttnLRP, {what}, {length} tokens", transformers.__version__


def resnet_pair(folder: Path):
    import torchvision
    from zennit.composites import EpsilonGammaBox
    from zennit.torchvision import ResNetCanonizer

    import rulegraph
    from rulegraph.ruleset import RuleSet
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    path = folder / "resnet18.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), str(path), input_names=["pixel_values"],
                      output_names=["logits"], opset_version=17, dynamo=False, do_constant_folding=False)
    graph = rulegraph.load(str(path))
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    zbox = next(e.rule for e in RuleSet.load("epsilon-gamma-box").entries if e.rule.name == "zbox")
    low = torch.tensor(zbox.low).reshape(1, 3, 1, 1).expand(x.shape)
    high = torch.tensor(zbox.high).reshape(1, 3, 1, 1).expand(x.shape)
    composite = EpsilonGammaBox(low, high, canonizers=[ResNetCanonizer()])

    def ours(audit: bool):
        return lambda: rulegraph.explain(graph, "epsilon-gamma-box", {"pixel_values": x}, audit=audit)

    def zennit():
        xi = x.clone().requires_grad_(True)
        with composite.context(model) as modified:
            out = modified(xi)
            seed = torch.zeros_like(out)
            seed[0, out[0].argmax()] = 1.0
            (r,) = torch.autograd.grad(out, xi, seed * out)
        return r
    return {"rulegraph (audit)": ours(True), "rulegraph (no audit)": ours(False), "Zennit": zennit}, \
        "EpsilonGammaBox, torchvision ResNet-18 (random weights), 224×224", torchvision.__version__


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", nargs="+", choices=["epsilon-gamma-box", "attnlrp"],
                    default=["epsilon-gamma-box", "attnlrp"], help="which comparisons to run")
    ap.add_argument("--compiled", action="store_true", help="AttnLRP also with compiled=True (a first call of tens "
                    "of seconds: the trace and TorchInductor's compile)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "peers_speed.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for pair in args.pairs:                     # fail early when a peer is missing
        __import__(PEERS[pair][0])
    builders = {"epsilon-gamma-box": resnet_pair,
                "attnlrp": lambda folder: bert_pair(args.length, folder, args.compiled)}
    sections = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for pair in args.pairs:
            calls, title, version = builders[pair](Path(tmp))
            firsts = {}
            for k in [k for k in calls if "compiled" in k]:       # the trace and the compile, timed apart
                start = time.perf_counter()
                calls[k]()
                firsts[k] = time.perf_counter() - start
            times = interleave(calls, args.rounds, warmup=1)
            rows = [(k, statistics.median(v) / 1e3, min(v) / 1e3) for k, v in times.items()]
            sections.append((title, rows, firsts))
            for k, med, lo in rows:
                print(f"{title}: {k:22s} median {med * 1000:8.1f} ms  min {lo * 1000:8.1f} ms", flush=True)
    lines = ["# rulegraph vs LXT and Zennit: time per explanation", "",
             f"{machine(args.threads)} · float32, batch 1, CPU · "
             + "".join(f"{PEERS[p][1]} {metadata.version(PEERS[p][0])} · " for p in args.pairs) +
             f"{args.rounds} interleaved rounds after a warm-up · load average {load_before:.1f} → "
             f"{os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs; other processes share them)", "",
             "`.peers/bin/python benchmarks/peers_speed.py "
             f"--rounds {args.rounds} --length {args.length} --threads {args.threads} --pairs {' '.join(args.pairs)}"
             f"{' --compiled' if args.compiled else ''}`", ""]
    for title, rows, firsts in sections:
        peer = rows[-1][1]
        lines += [f"## {title}", "", "| method | median (ms) | min (ms) | vs peer (median) |", "|---|---:|---:|---:|"]
        lines += [f"| {k} | {med * 1000:.1f} | {lo * 1000:.1f} | {med / peer:.2f}× |" for k, med, lo in rows]
        lines += [f"| {k}: first call (trace and compile) | {s * 1000:.0f} | | |" for k, s in firsts.items()]
        lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
