"""Command-line options of the decomposition pass (``rulegraph explain|audit --rules decomposition``)."""
from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from ..errors import InputError

#: command-line option → the pass argument it sets
ARGUMENTS = {"groups": "groups", "alpha": "alpha", "lambda_": "threshold", "variant": "variant"}


def decomposition_options(f):
    """``--alpha``, ``--lambda``, ``--groups`` and ``--variant``: used by rule sets with ``pass: decomposition``."""
    for decorator in reversed([
        click.option("--groups", default=None, metavar="token|word|source:K|0-3,4-9",
                     help="decomposition: the input partition (default token)"),
        click.option("--alpha", default=None, metavar="signed|abs|hybrid",
                     help="decomposition: α of the ReLU bias reallocation (Eq. 12, 13, 17; default: the rule file's)"),
        click.option("--lambda", "lambda_", type=float, default=None, metavar="λ",
                     help="decomposition: threshold of --alpha hybrid (Eq. 17; default 0.1)"),
        click.option("--variant", default=None, metavar="hat|bar",
                     help="decomposition: hat (D̂, bias reallocated) or bar (D̄, bias kept as its own component)"),
    ]):
        f = decorator(f)
    return f


def pass_arguments(ruleset, opts: dict[str, Any], encoded) -> dict[str, Any]:
    """The pass's own :func:`~rulegraph.explain` arguments from the command's options: only those
    the rule set's pass declares; a text's word ids and tokens go to a pass that takes them."""
    from ..passes import PASSES
    given = {arg: opts[opt] for opt, arg in ARGUMENTS.items() if opts.get(opt) is not None}
    if ruleset is None:
        if given:
            raise InputError(f"--{next(o for o, a in ARGUMENTS.items() if a in given).rstrip('_')} applies to rule "
                             "sets (--rules), not to --method")
        return {}
    kind = PASSES.get(ruleset.pass_name)
    refused = [opt for opt, arg in ARGUMENTS.items() if arg in given and arg not in kind.options]
    if refused:
        raise InputError(f"--{refused[0].rstrip('_')} applies to rule sets with `pass: decomposition` only; "
                         f"{ruleset.name or ruleset.source} runs the {kind.name} pass")
    if encoded is not None and "word_ids" in kind.options:
        given.update(word_ids=[encoded.word_ids], tokens=[encoded.tokens])
    return given


def reconstruction_table(audit) -> Table:
    """Largest |Σ components − value| per layer, absolute and relative to the node's largest |value|."""
    t = Table(title="reconstruction per layer: |Σ components − forward value|")
    for col in ("layer", "nodes", "max abs error", "max rel. error", "worst node"):
        t.add_column(col, justify="left" if col in ("layer", "worst node") else "right", overflow="fold")
    for r in audit.reconstruction:
        t.add_row(r.name, str(r.nodes), f"{r.max_abs_error:.2e}", f"{r.max_relative_error:.2e}", r.worst_node)
    return t
