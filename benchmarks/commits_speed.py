"""Time per explanation of two checkouts of rulegraph, side by side in one run.

    git worktree add ../old REV          # the commit to compare against
    python benchmarks/commits_speed.py ../old [--rounds 15] [--out benchmarks/results/commits_speed.md]

One worker process per checkout (its folder first on ``PYTHONPATH``, with ``rulegraph/rules`` linked to
the checkout's ``rules/``, or ``rulegraph/rulesets`` to ``rulesets/`` in one from before the move) loads the same
models and inputs; the parent asks them in turn, case after case, round after round, so a
busy machine slows both alike, and reports medians and their ratio. The cases are the
rulegraph rows of ``explain_speed.py`` (``lrp-ah-ln`` on the demo model at 94 and 512 tokens)
and of ``peers_speed.py`` (AttnLRP on the demo model at 128 tokens; EpsilonGammaBox on a
ResNet-18 of torchvision's architecture, random weights, written out here so torchvision is
not needed), each with and without the audit. 2 threads per worker, one worker busy at a time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import machine

REPO = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, time, torch
torch.set_num_threads(2)
import rulegraph
folder = sys.argv[1]
cases = json.load(open(folder + "/cases.json"))
graphs = {}
def run(case):
    model, rules, inputs, audit = case["model"], case["rules"], case["inputs"], case["audit"]
    if model not in graphs:
        graphs[model] = rulegraph.load(model)
    feeds = torch.load(folder + "/" + inputs)
    t0 = time.perf_counter()
    rulegraph.explain(graphs[model], rules, feeds, audit=audit)
    return time.perf_counter() - t0
for case in cases.values():
    run(case)                                  # warm-up: plans, bindings, shape caches
print("ready", flush=True)
for line in sys.stdin:
    print(run(cases[line.strip()]), flush=True)
"""


def resnet18():
    """torchvision's ResNet-18 architecture (BasicBlock [2, 2, 2, 2]) in plain torch.nn."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.down = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(out + (x if self.down is None else self.down(x)))

    layers, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(512, 1000)).eval()


def prepare(folder: Path) -> dict:
    import torch
    sys.path.insert(0, str(REPO / "examples" / "sentiment"))
    import data
    from train import ensure_model

    from rulegraph.text import TextEncoder
    model = ensure_model()
    encoder = TextEncoder(model.parent / "tokenizer.json")
    _, test = data.imdb()
    text = " ".join(t for t, _ in test[:20])
    cases = {}
    for length in (94, 128, 512):
        encoder.max_length = length
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.save(encoder.encode(text).inputs, folder / f"text{length}.pt")
    for rules, length in (("lrp-ah-ln", 94), ("lrp-ah-ln", 512), ("attnlrp", 128)):
        for audit in (True, False):
            cases[f"{rules} T={length} {'audit' if audit else 'no audit'}"] = dict(
                model=str(model), rules=rules, inputs=f"text{length}.pt", audit=audit)
    torch.manual_seed(0)
    path = folder / "resnet18.onnx"
    torch.onnx.export(resnet18(), (torch.randn(1, 3, 224, 224),), str(path), input_names=["pixel_values"],
                      output_names=["logits"], opset_version=17, dynamo=False, do_constant_folding=False)
    torch.save({"pixel_values": torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))},
               folder / "image.pt")
    for audit in (True, False):
        cases[f"epsilon-gamma-box ResNet-18 {'audit' if audit else 'no audit'}"] = dict(
            model=str(path), rules="epsilon-gamma-box", inputs="image.pt", audit=audit)
    (folder / "cases.json").write_text(json.dumps(cases))
    return cases


def link_packages(checkout: Path) -> None:
    """In a checkout other than the installed one, link the packages the install maps from top-level
    folders (``rulegraph/rules`` → ``rules/``, ``rulegraph/exporters`` → ``exporters/``; ``rulesets/``
    before the move), so its ``rulegraph`` imports its own and not the installed checkout's."""
    if checkout == REPO:
        return
    for name, target in (("rules", "rules"), ("exporters", "exporters"), ("rulesets", "rulesets")):
        link = checkout / "rulegraph" / name
        if (checkout / target).is_dir() and not link.exists():
            link.symlink_to(Path("..") / target)


def worker(checkout: Path, folder: Path) -> subprocess.Popen:
    link_packages(checkout)
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "2"}
    p = subprocess.Popen([sys.executable, "-c", WORKER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env, cwd=str(checkout))
    assert p.stdout.readline().strip() == "ready", f"worker for {checkout} failed to start"
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path, help="the other checkout")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", default="", metavar="TEXT", help="only the cases whose name contains TEXT")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "commits_speed.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = {k: v for k, v in prepare(folder).items() if args.only in k}
        (folder / "cases.json").write_text(json.dumps(cases))
        workers = {"old": worker(args.old.resolve(), folder), "new": worker(REPO, folder)}
        times = {(c, w): [] for c in cases for w in workers}
        for r in range(args.rounds):
            for case in cases:
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for w in order:
                    workers[w].stdin.write(case + "\n")
                    workers[w].stdin.flush()
                    times[case, w].append(float(workers[w].stdout.readline()))
        for p in workers.values():
            p.stdin.close()
            p.wait()
    rev = {w: subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip() for w, path in (("old", args.old), ("new", REPO))}
    lines = ["# Two checkouts side by side\n",
             f"{machine(2)} · old {rev['old']} · new "
             f"{rev['new']} (with its uncommitted changes) · median of {args.rounds} interleaved rounds · 2 threads\n",
             "| case | old | new | new / old |", "|---|---:|---:|---:|"]
    for case in cases:
        old, new = statistics.median(times[case, "old"]), statistics.median(times[case, "new"])
        lines.append(f"| {case} | {old * 1e3:.1f} ms | {new * 1e3:.1f} ms | {new / old:.2f}× |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
