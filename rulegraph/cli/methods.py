"""``rulegraph methods``: the explanation methods and their options."""
from __future__ import annotations

import click
from rich import box
from rich.table import Table

from .console import out


@click.command("methods")
def methods_cmd():
    """List the explanation methods (baselines and rule sets), what their scores are, and their options."""
    from ..methods import methods       # torch and the rule sets: only when the command runs, not for --help
    # Compact: no box, one line per option, the description given the remaining width (the
    # console is 140 columns when piped, the terminal's width otherwise).
    t = Table(title="explanation methods (rulegraph explain --method NAME [-o KEY=VALUE])", box=box.SIMPLE_HEAD,
              pad_edge=False, show_edge=False)
    t.add_column("name", no_wrap=True)
    t.add_column("kind", no_wrap=True)
    t.add_column("scores", overflow="fold", max_width=24)
    t.add_column("options", overflow="fold", max_width=34)
    t.add_column("description", overflow="fold", ratio=1)
    for name, m in methods().items():
        unset = "(rule file)" if m.rule_set else "(unset)"     # an unset baseline option: see its help
        opts = "\n".join(f"{o.name}={unset if o.default is None else o.default}" + (f" ({'|'.join(map(str, o.choices))})" if o.choices else "")
                         for o in m.options if o.cli)
        t.add_row(name, "rule set" if m.rule_set else "baseline", m.units(), opts or "–", _first_sentence(m.description))
    out.print(t)
    out.print("[dim]a rule set's whole description: rulegraph rules NAME[/]")


def _first_sentence(text: str) -> str:
    """The description up to its first full stop (``rulegraph rules NAME`` prints a rule set's whole)."""
    import re
    text = " ".join(text.split())
    end = re.search(r"(?<!\bal)(?<!\bEq)(?<!\bSec)(?<!\bApp)(?<!\bvs)(?<!\be\.g)(?<!\bi\.e)\.\s+(?=[A-Z])", text)
    return text if end is None else text[:end.start() + 1] + " …"
