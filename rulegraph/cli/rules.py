"""``rulegraph rules [NAME]``: the shipped rule sets."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from .console import out


@click.command("rules")
@click.argument("name", required=False)
def rules_cmd(name):
    """List the shipped rule sets, or print one."""
    from ..ruleset import RuleSet, shipped_rule_sets
    shipped = shipped_rule_sets(None)
    if name:
        rs = RuleSet.load(name)
        path = shipped.get(name, Path(name))
        # verbatim: no console markup (``[quantization, batchnorm]`` is YAML, not a style) and no wrapping
        click.echo(path.read_text() if path.exists() else str(rs), nl=False)
        return
    t = Table(title="shipped rule sets (rulegraph rules NAME prints one)")
    t.add_column("name")
    t.add_column("description", overflow="fold")
    for key in sorted(shipped):
        t.add_row(key, RuleSet.load(key).description)
    out.print(t)
