"""``rulegraph methods``: the explanation methods and their options."""
from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from ..methods import methods


@click.command("methods")
def methods_cmd():
    """List the explanation methods (baselines and rule sets), what their scores are, and their options."""
    t = Table(title="explanation methods (rulegraph explain --method NAME [-o KEY=VALUE])")
    for col in ("name", "kind", "scores", "options", "description"):
        t.add_column(col, overflow="fold")
    for name, m in methods().items():
        opts = "\n".join(f"{o.name}={'(rule file)' if o.default is None else o.default}" + (f" ({'|'.join(map(str, o.choices))})" if o.choices else "")
                         for o in m.options)
        t.add_row(name, m.kind, m.quantity(), opts or "–", m.description)
    Console(highlight=False).print(t)
