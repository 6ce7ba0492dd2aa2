"""Re-run part of the committed RT evaluation with the current code and compare per-text values.

    python examples/sentiment/check_results.py [--n 50] [--methods a,b] [--out DIR] [--model DIR]
                                               [--reference FILE] [--results FILE]

Evaluates the first ``N`` texts of the committed RT run (``docs/evaluation/rt-config.json``:
same model, texts, metric settings and method options) into a temporary folder (never
docs/), then compares every metric value of every (text, method) with the committed row
of ``docs/evaluation/rt-results.jsonl.gz``. Prints texts × methods × metrics compared and
the largest absolute difference of the values and of the curves; exits 1 when one exceeds
``--tolerance`` (1e-12). ``--reference`` compares with another results file instead (e.g.
the previous code's run on the same model file, when the committed model is not at hand);
``--results`` checks a results file already made instead of running the current code.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

import data
import evaluate as example
import train
from rulegraph.evaluate.runner import Config, Evaluation
from rulegraph.scale.job import digest

DOCS = train.REPO / "docs" / "evaluation"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--methods", default=None, help="default: every method of the committed run")
    parser.add_argument("--model", type=Path, default=train.default_cache_dir(),
                        help="folder with model.onnx and tokenizer.json (read only; default: the demo's cache)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: a temporary one)")
    parser.add_argument("--tolerance", type=float, default=1e-12)
    parser.add_argument("--reference", type=Path, default=DOCS / "rt-results.jsonl.gz",
                        help="per-text results to compare with (.jsonl or .jsonl.gz; default: the committed run), "
                             "e.g. those of another version of the code on the same model")
    parser.add_argument("--results", type=Path, default=None,
                        help="results.jsonl to check (default: run the current code on the first --n texts)")
    args = parser.parse_args(argv)
    opener = gzip.open if args.reference.suffix == ".gz" else open
    committed = [json.loads(line) for line in opener(args.reference, "rt")]
    stored = json.loads((DOCS / "rt-config.json").read_text())
    methods = args.methods.split(",") if args.methods else list(dict.fromkeys(r["method"] for r in committed))
    out = args.out or Path(tempfile.mkdtemp(prefix="rt-check-"))
    out.mkdir(parents=True, exist_ok=True)
    _, test = data.rotten_tomatoes(train.SEED)
    csv_path = example.write_csv(out / "rt-test.csv", test[:example.PARTS["rt"]])
    model = args.model / "model.onnx"
    config = Config(model=str(model), data=str(csv_path), methods=methods, metrics=stored["metrics"],
                    options={k: v for k, v in stored["options"].items() if k in methods}, removal=stored["removal"],
                    settings=stored["settings"], seed=stored["seed"], n=args.n, batch=8)
    identity = config.identity()
    differ = [k for k in stored if k != "options" and stored[k] != identity.get(k)]
    if [k for k in differ if k != "model"]:
        print(f"the committed run differs in {', '.join(differ)}; the comparison would be meaningless")
        return 1
    if differ:      # another export of the model: the explained logits below tell whether it computes the same
        print(f"note: {model} is not byte-identical to the committed run's model ({stored['model'][:19]}…)")
    results = args.results
    if results is None:
        Evaluation(config, out / "run", force=True, progress=False).run()
        results = out / "run" / "results.jsonl"
    mine = {(r["example"], r["method"]): r for r in map(json.loads, results.open())
            if r["example"] < args.n and r["method"] in methods}      # example: the row in the file
    theirs = {(r["example"], r["method"]): r for r in committed if (r["example"], r["method"]) in mine}
    worst, compared, where = 0.0, 0, None
    curve_worst, points = 0.0, 0
    logit = max(abs(mine[k]["logit"] - r["logit"]) for k, r in theirs.items())
    for key, row in theirs.items():
        for name, value in row["metrics"].items():
            new = mine[key]["metrics"].get(name)
            if value is None or new is None:
                assert value is None and new is None, (key, name, value, new)
                continue
            compared += 1
            if abs(new - value) > worst:
                worst, where = abs(new - value), (*key, name)
        for name, curve in row.get("curves", {}).items():
            new_curve = mine[key]["curves"].get(name)
            assert new_curve is not None and len(new_curve) == len(curve), (key, name)
            points += len(curve)
            curve_worst = max([curve_worst, *(abs(a - b) for a, b in zip(new_curve, curve))])
    texts = len({k[0] for k in theirs})
    print(f"{texts} texts × {len(methods)} methods ({', '.join(methods)}) × {len(stored['metrics'])} metrics: "
          f"{compared} values compared (word-deletion skips misclassified texts); "
          f"max |difference| {worst:.3g}{f' at {where}' if where else ''}; {points} curve points, max |difference| "
          f"{curve_worst:.3g}; explained logits differ by at most {logit:.3g}; results in {results}")
    return 0 if max(worst, curve_worst) <= args.tolerance and len(theirs) == len(mine) else 1

if __name__ == "__main__":
    sys.exit(main())
