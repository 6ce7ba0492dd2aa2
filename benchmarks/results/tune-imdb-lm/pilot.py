"""Write the rule files of the gated MLP's directions tried by hand beside the searches (issue 41), and the
tune part they are scored on (never validation or test).

    .venv/bin/python benchmarks/results/tune-imdb-lm/pilot.py DATA.csv OUT_DIR

DATA.csv: the 600 held-out prefixes (`make_data.py 600`); OUT_DIR gets `tune.csv` (the 180 prefixes of the
search's tune part, `attnlrp-dense-600/split.csv`) and, for `attnlrp` and `lrp-ah-ln`, the rule set with
one entry put first (the first matching entry gives a node its rule) for the SwiGLU product
SiLU(x W_gate) ⊙ (x W_up) (the Llama export's `*/mlp/Mul`):
- `START-gate.yaml`: the gate held constant (Gradient×Input with the gate detached: all of the product's
  relevance to the up projection, as MambaLRP holds its SiLU gate, Jafari et al., NeurIPS 2024);
- `START-up.yaml`: the up projection held constant (all of it to the gate).
`attnlrp` splits the product uniformly (half to each factor), `lrp-ah-ln` takes its gradient (each factor
the whole product's relevance).
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

from rulegraph.rules import shipped_rule_sets

HERE = Path(__file__).parent


def main() -> None:
    data, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    with data.open(newline="") as f:
        rows = list(csv.DictReader(f))
    with (HERE / "attnlrp-dense-600" / "split.csv").open(newline="") as f:
        tune = [rows[int(r["record"])] for r in csv.DictReader(f) if r["part"] == "tune"]
    with (out / "tune.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["text"])
        writer.writeheader()
        writer.writerows({"text": r["text"]} for r in tune)
    shipped = shipped_rule_sets(None)
    for start in ("attnlrp", "lrp-ah-ln"):
        for held, detach in (("gate", 0), ("up", 1)):
            entry = f'  - name: "*/mlp/Mul"\n    op: Mul\n    rule: gradient\n    params: {{detach: [{detach}]}}\n'
            text = shipped[start].read_text().replace("rules:\n", "rules:\n" + entry, 1)
            (out / f"{start}-{held}.yaml").write_text(text)
    print(f"wrote {len(tune)} prefixes and 4 rule files to {out}")


if __name__ == "__main__":
    main()
