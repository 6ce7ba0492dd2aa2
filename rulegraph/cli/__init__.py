"""Command line: ``rulegraph explain | audit | check | rules | methods | explain-dataset | evaluate | compare | tune |
heads | export``.

Errors in what the user gave (files, rule files, inputs, options) print one line
and exit 2; ``check`` exits 1 when a node has no rule and the rule set says
``on_unmatched: error``; ``audit`` exits 1 when conservation is flagged. Set
``RULEGRAPH_DEBUG=1`` to see tracebacks.

Each command lives in its own module, imported only when that command runs (or shows its
own ``--help``): ``rulegraph --help`` loads neither torch nor the models.
"""
from __future__ import annotations

import importlib
import os
import sys
import warnings

import click
from rich.markup import escape

from ..errors import InputError, MissingDependency, RulegraphError
from .console import err

#: command → (module, function, one-line summary for ``rulegraph --help``), in the order listed
COMMANDS = {
    "explain": ("explain", "explain_cmd", "Relevance of each input token for MODEL's output, with the conservation summary."),
    "audit": ("explain", "audit_cmd", "Per-layer and per-node conservation table; exits 1 if conservation is flagged."),
    "check": ("explain", "check_cmd", "Which rule each node got, and from which rule-file line."),
    "rules": ("rules", "rules_cmd", "List the shipped rule sets, or print one."),
    "methods": ("methods", "methods_cmd", "List the explanation methods (baselines and rule sets) and their options."),
    "explain-dataset": ("dataset", "explain_dataset_cmd",
                        "Explain every record of a data file (CSV, JSONL, Parquet) into Parquet; local or on Ray."),
    "evaluate": ("evaluate", "evaluate_cmd", "Faithfulness metrics per method on a CSV of texts; resumable."),
    "compare": ("compare", "compare_cmd", "Paired differences between methods (per text, bootstrap) from evaluation results."),
    "tune": ("tune", "tune_cmd", "Search a rule file for faithfulness on your data; chosen on validation, reported on test."),
    "heads": ("heads", "heads_cmd", "Attention heads: calibrate Mask-LRP's head mask (positional / syntactic) from a dataset."),
    "export": ("export", "export_cmd", "Export a Hugging Face model directory to ONNX (or torch.export) + tokenizer.json."),
}


class Commands(click.Group):
    """A group whose commands are imported when used."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[name]
        return getattr(importlib.import_module(f".{module}", __name__), attribute)

    def resolve_command(self, ctx, args):
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            refuse_repeated(ctx, command, name, rest)
        return name, command, rest

    def format_commands(self, ctx, formatter):
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, _, summary) in COMMANDS.items()])


def refuse_repeated(ctx: click.Context, command: click.Command, name: str, args: list[str]) -> None:
    """Refuse an option that takes one value given more than once (``-q who -q what``: click would
    keep the last without a word); options declared ``multiple`` and flags may repeat. Arguments
    click cannot parse are left to click, which names them."""
    sub = click.Context(command, parent=ctx, info_name=name)
    try:
        _, rest, order = command.make_parser(sub).parse_args(list(args))
    except click.UsageError:
        return
    seen: dict[str, int] = {}
    for param in order:
        if isinstance(param, click.Option) and not param.multiple and not param.is_flag and not param.count:
            seen[param.name] = seen.get(param.name, 0) + 1
            if seen[param.name] == 2:
                raise InputError(f"{'/'.join(param.opts)} takes one value and was given more than once; give it "
                                     "once")
    if isinstance(command, click.Group) and rest:      # a group's subcommand (heads calibrate)
        found = command.get_command(sub, rest[0])
        if found is not None:
            refuse_repeated(sub, found, rest[0], rest[1:])


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="rulegraph")
def cli():
    """Explain exported networks with declarative propagation rules, and audit conservation
    layer by layer."""


def _show_warning(message, category, filename, lineno, file=None, line=None):
    err.print(f"[yellow]warning:[/] {escape(str(message))}", soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _show_warning
    debug = bool(os.environ.get("RULEGRAPH_DEBUG"))
    try:
        cli.main(args=argv, prog_name="rulegraph", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        err.print("aborted")
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except RulegraphError as exc:
        if debug:
            raise
        err.print(f"[red]error:[/] {escape(exc.cli or str(exc))}", soft_wrap=True)
        return 2
    except Exception as exc:  # a defect: still one line, with a way to see more
        if debug:
            raise
        missing = MissingDependency.of(exc) if isinstance(exc, ImportError) else None
        if missing is not None:           # not a defect: an optional package, named with its install command
            err.print(f"[red]error:[/] {escape(str(missing))}", soft_wrap=True)
            return 2
        err.print(f"[red]internal error:[/] {type(exc).__name__}: {escape(str(exc))} "
                  "(set RULEGRAPH_DEBUG=1 for the traceback)", soft_wrap=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
