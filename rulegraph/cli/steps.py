"""``rulegraph explain --steps``: an encoder–decoder's relevance at every generated step
(:func:`rulegraph.seq2seq.explain_steps`), the source-vs-prefix share per step in the terminal
and the rows × steps matrix as JSON."""
from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table

from ..errors import InputError
from .console import out
from .inputs import write
from .render import fmt


def explain_steps_cmd(graph, ruleset, requests, opts, labels, json_path, html_path, force) -> None:
    """Refuse what --steps cannot take (one line each), explain every step, show and write the result."""
    import torch

    from ..seq2seq import explain_steps
    if ruleset is None:
        raise InputError("--steps explains with a rule set (--rules), not a --method")
    given = [f"--{o}" for o in ("target", "position", "contrast", "objective") if opts.get(o) is not None]
    given += ["--html"] if html_path is not None else []
    if given:
        raise InputError(f"--steps explains every decoder position for the token generated there; "
                         f"it takes no {', '.join(given)}")
    if len(requests) != 1:
        raise InputError(f"--steps explains one input; got {len(requests)} texts")
    feeds, _ = requests[0]
    result = explain_steps(graph, ruleset, feeds, output=opts["output_name"], device=opts["device"],
                           dtype=getattr(torch, opts["dtype"]), labels=labels,
                           **({"score": opts["score"]} if opts.get("score", "logit") != "logit" else {}))
    if json_path is not None:
        write(json_path, json.dumps(result.to_dict(), indent=2), force, "JSON")
        if str(json_path) == "-":
            return
    out.print(steps_table(result))


def steps_table(steps) -> Table:
    """One column per generated token: the summed relevance of the source and of the prefix, the
    prefix's share (Yang et al. 2023, Fig. 4) and the conservation residual."""
    table = Table(title=f"{escape(steps.rules)}: relevance per generated token "
                        f"({steps.sources} source rows, {len(steps.rows) - steps.sources} prefix rows)")
    table.add_column("")
    for t, label in enumerate(steps.columns):
        table.add_column(f"{t}: {escape(label)}", justify="right")
    shares = steps.shares()
    table.add_row("source", *(fmt(float(x)) for x in steps.source))
    table.add_row("prefix", *(fmt(float(x)) for x in steps.prefix))
    table.add_row("prefix share", *("—" if x != x else f"{100 * x:.1f}%" for x in shares[1].tolist()))
    table.add_row("residual", *(fmt(x) for x in steps.residual))
    return table
