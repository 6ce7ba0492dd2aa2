"""Float64 results of every shipped rule set and baseline on the test models, to compare two commits.

    python benchmarks/regression.py snapshot OUT.pt      # with the checkout under test on the path
    python benchmarks/regression.py compare OLD.pt NEW.pt [--tolerance 1e-12]

A snapshot holds, per (model, method): the boundary relevance, the explained value, the
conservation figures and every node's audit figures (in, out, absorbed, breaks). The tiny
random-weight models of ``tests/tiny.py`` and ``tests/cnn.py`` are built with fixed seeds and
exported to ONNX (TorchScript and dynamo) and ``torch.export``. Only the public API is used, so
the same script snapshots an older commit: put that checkout first on ``PYTHONPATH``.
Compare reports the largest difference relative to each tensor's largest magnitude.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import cnn  # noqa: E402
import tiny  # noqa: E402

import rulegraph  # noqa: E402
from rulegraph.methods import explain_with  # noqa: E402

BASELINES = ("gs", "ig", "attention", "rollout", "loo", "random")
OPTIONS = {"loo": {"mode": "delete"}}      # the test models have no tokenizer: no [MASK] id


def _models(folder: Path):
    bert = tiny.build("bert")
    yield "bert-ts", rulegraph.load(tiny.onnx(bert, folder / "bert.onnx")), tiny.token_inputs(pad=2), "transformers"
    yield "bert-dynamo", rulegraph.load(tiny.onnx(bert, folder / "bert-d.onnx", exporter="dynamo")), \
        tiny.token_inputs(pad=2), "transformers"
    from rulegraph.exporters import HFClassifier
    feeds = tiny.token_inputs(batch=2, length=8, pad=2)
    program = torch.export.export(HFClassifier(bert), (), kwargs=feeds)
    yield "bert-fx", rulegraph.load(program), feeds, "transformers"
    names = ("input_ids", "attention_mask")
    for arch in ("gpt2", "distilbert", "roberta"):
        path = tiny.onnx(tiny.build(arch), folder / f"{arch}.onnx", names=names)
        yield arch, rulegraph.load(path), tiny.token_inputs(names, pad=0), "transformers"
    x = cnn.image(1, 8)
    for arch, example in (("mlp", cnn.image(1, 2)), ("cnn", x), ("resnet", x)):
        path = cnn.onnx(cnn.build(arch), folder / f"{arch}.onnx", example)
        yield arch, rulegraph.load(path), {"pixel_values": example}, "cnns"
    path = cnn.onnx(cnn.build("resnet"), folder / "resnet-bn.onnx", x, keep_batchnorm=True)
    yield "resnet-bn", rulegraph.load(path), {"pixel_values": x}, "cnns"


def snapshot(out: Path) -> None:
    torch.set_num_threads(1)
    result: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model, graph, feeds, family in _models(Path(tmp)):
            methods = sorted(rulegraph.shipped_rule_sets(family))
            if family == "transformers":
                methods += list(BASELINES)
            for method in methods:
                try:
                    if method in BASELINES:
                        e = explain_with(graph, method, feeds, dtype=torch.float64, **OPTIONS.get(method, {}))
                    else:
                        e = rulegraph.explain(graph, method, feeds, dtype=torch.float64)
                except Exception as exc:  # recorded: a method that fails must fail the same way
                    result[f"{model}/{method}"] = {"error": f"{type(exc).__name__}: {exc}"}
                    continue
                entry = {"boundary": {k: v.clone() for k, v in e.boundary.items()},
                         "output_value": torch.tensor(e.output_value, dtype=torch.float64)}
                if e.audit is not None:
                    c = e.audit.conservation
                    entry["conservation"] = torch.tensor([c.output_value, c.input_total, c.absorbed, c.breaks],
                                                         dtype=torch.float64)
                    entry["nodes"] = {n.name: torch.tensor([n.relevance_in, n.relevance_out, n.absorbed, n.breaks],
                                                           dtype=torch.float64) for n in e.audit.nodes}
                result[f"{model}/{method}"] = entry
                print(f"{model}/{method}", flush=True)
    torch.save(result, out)


def _worst(a, b, path: str, worst: list) -> None:
    if isinstance(a, dict):
        if set(a) != set(b):
            worst.append((float("inf"), f"{path}: keys differ: {sorted(set(a) ^ set(b))[:5]}"))
            return
        for k in a:
            _worst(a[k], b[k], f"{path}/{k}", worst)
        return
    if isinstance(a, str) or isinstance(b, str):
        if a != b:
            worst.append((float("inf"), f"{path}: {a} vs {b}"))
        return
    if a.shape != b.shape:
        worst.append((float("inf"), f"{path}: shape {tuple(a.shape)} vs {tuple(b.shape)}"))
        return
    scale = max(a.abs().max().item() if a.numel() else 0.0, 1e-300)
    worst.append(((a - b).abs().max().item() / scale if a.numel() else 0.0, path))


def compare(old: Path, new: Path, tolerance: float) -> int:
    a, b = torch.load(old), torch.load(new)
    added = sorted(set(b) - set(a))
    if added:                                # a method the old commit did not have: nothing to compare
        print(f"only in the new snapshot (not compared): {', '.join(added)}")
        b = {k: v for k, v in b.items() if k in a}
    worst: list = []
    _worst(a, b, "", worst)
    worst.sort(reverse=True)
    print(f"{len(a)} (model, method) pairs, {len(worst)} tensors compared; largest relative differences:")
    for value, path in worst[:8]:
        print(f"  {value:.3e}  {path}")
    bad = [w for w in worst if w[0] > tolerance]
    print(f"{'FAIL' if bad else 'ok'}: {len(bad)} above {tolerance:g}")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("snapshot")
    s.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    c.add_argument("--tolerance", type=float, default=1e-12)
    args = p.parse_args()
    if args.command == "snapshot":
        snapshot(args.out)
        return 0
    return compare(args.old, args.new, args.tolerance)


if __name__ == "__main__":
    sys.exit(main())
