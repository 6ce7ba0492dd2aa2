"""Command-line options of the decomposition pass (``rulegraph explain|audit --rules decomposition``)."""
from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from ..errors import InputError
from ..rules.components import ALPHAS, VARIANTS

KEYS = ("alpha", "lambda_", "groups", "variant")


def decomposition_options(f):
    """``--alpha``, ``--lambda``, ``--groups`` and ``--variant``: used by rule sets with ``pass: decomposition``."""
    for decorator in reversed([
        click.option("--groups", default=None, metavar="token|word|source:K|0-3,4-9",
                     help="decomposition: the input partition (default token)"),
        click.option("--alpha", type=click.Choice(ALPHAS), default=None,
                     help="decomposition: α of the ReLU bias reallocation (Eq. 12, 13, 17; default: the rule file's)"),
        click.option("--lambda", "lambda_", type=float, default=None, metavar="λ",
                     help="decomposition: threshold of --alpha hybrid (Eq. 17; default 0.1)"),
        click.option("--variant", type=click.Choice(VARIANTS), default=None,
                     help="decomposition: hat (D̂, bias reallocated) or bar (D̄, bias kept as its own component)"),
    ]):
        f = decorator(f)
    return f


def pass_arguments(ruleset, opts: dict[str, Any], encoded) -> dict[str, Any]:
    """The pass's own :func:`~rulegraph.explain` arguments from the command's options."""
    given = [k for k in KEYS if opts.get(k) is not None]
    if ruleset is None or getattr(ruleset, "pass_name", "relevance") != "decomposition":
        if given:
            raise InputError(f"--{given[0].rstrip('_')} applies to rule sets with `pass: decomposition` only")
        return {}
    kwargs: dict[str, Any] = dict(groups=opts.get("groups") or "token", alpha=opts.get("alpha"),
                                  threshold=opts.get("lambda_"), variant=opts.get("variant"))
    if encoded is not None:
        kwargs["word_ids"] = [encoded.word_ids]
        kwargs["tokens"] = [encoded.tokens]
    return kwargs


def reconstruction_table(audit) -> Table:
    """Largest |Σ components − value| per layer, absolute and relative to the node's largest |value|."""
    t = Table(title="reconstruction per layer: |Σ components − forward value|")
    for col in ("layer", "nodes", "max abs error", "max rel. error", "worst node"):
        t.add_column(col, justify="left" if col in ("layer", "worst node") else "right", overflow="fold")
    for r in audit.reconstruction:
        t.add_row(r.name, str(r.nodes), f"{r.max_abs_error:.2e}", f"{r.max_relative_error:.2e}", r.worst_node)
    return t
