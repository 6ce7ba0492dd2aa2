"""Write the rule files of the directions tried by hand beside the searches (issue 41): `cp-lrp` with one
change each, scored with `rulegraph evaluate` on a tune part (never on validation or test).

    .venv/bin/python benchmarks/results/tune-imdb/pilot.py OUT_DIR

Each file is `cp-lrp.yaml` with one entry put first (the first matching entry gives a node its rule):
- `eps-E.yaml`: LRP-ε at every linear layer (an Add or Gemm with a constant input), ε = E;
- `nobias-E.yaml`: the same with the biases left out of z (`bias: false`: they absorb nothing);
- `head-G.yaml`: LRP-γ (γ = G) at the Gemm layers only (a BERT's pooler and classifier);
- `blocks-head.yaml`: LRP-γ 0.008 in blocks 0-2, 0.001 in blocks 3-5 and 0.9 at the head (the demo
  model's first tuned set with its head's γ acting);
- `lower-G.yaml`: LRP-γ (γ = G) in blocks 0-2 and LRP-0 (γ = 0) elsewhere (the demo model's tuned set's form);
- `ab21.yaml`, `ab1505.yaml`, `zplus.yaml`: LRP-αβ (α 2 β 1; α 1.5 β 0.5) and LRP-z⁺ at every MatMul
  with a constant weight.
"""
from __future__ import annotations

import sys
from pathlib import Path

from rulegraph.rules import shipped_rule_sets

LINEAR = "op: [Add, Gemm]\n    inputs:\n      any: {from: constant}"
DENSE = "op: MatMul\n    inputs:\n      1: {from: constant}"
HEAD = "op: Gemm\n    inputs:\n      1: {from: constant}"
BLOCKS = ("op: [MatMul, Gemm]\n    inputs:\n      1: {from: constant}", "gamma", "{gamma: 0.9}\n    per_layer:\n"
          "      - {blocks: \"0-2\", params: {gamma: 0.008}}\n      - {blocks: \"3-5\", params: {gamma: 0.001}}")

FILES = {
    **{f"eps-{e:g}": (LINEAR, "epsilon", f"{{epsilon: {e:.1e}}}") for e in (1e-3, 1e-2, 0.1, 0.3, 1.0, 3.0)},
    **{f"nobias-{e:g}": (LINEAR, "epsilon", f"{{epsilon: {e:.1e}, bias: false}}") for e in (1e-6, 1e-2, 0.1)},
    **{f"head-{g}": (HEAD, "gamma", f"{{gamma: {g}}}") for g in (0.25, 1.0, 4.0)},
    "blocks-head": BLOCKS,
    **{f"lower-{g}": (BLOCKS[0], "gamma", "{gamma: 0.0}\n    per_layer:\n"
                                          f"      - {{blocks: \"0-2\", params: {{gamma: {g}}}}}")
       for g in (0.02, 0.05)},
    "ab21": (DENSE, "alphabeta", "{alpha: 2.0, beta: 1.0}"),
    "ab1505": (DENSE, "alphabeta", "{alpha: 1.5, beta: 0.5}"),
    "zplus": (DENSE, "zplus", "{}"),
}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    start = shipped_rule_sets(None)["cp-lrp"].read_text()
    for name, (selectors, rule, params) in FILES.items():
        entry = f"  - {selectors}\n    rule: {rule}\n    params: {params}\n"
        (out / f"{name}.yaml").write_text(start.replace("rules:\n", "rules:\n" + entry, 1))
    print(f"wrote {len(FILES)} rule files to {out}")


if __name__ == "__main__":
    main()
