"""``rulegraph evaluate``: faithfulness metrics for several methods on a CSV of texts."""
from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..errors import InputError
from ..evaluate import metrics as M
from ..evaluate import protocols as P
from ..scale.listener import Listener
from ..tokens import RUNTIMES, REMOVALS
from .options import Bounded, check_folder, engine_options, make_engine, model_argument

# Only light modules above (no torch): `rulegraph evaluate --help` loads in a fraction of a second;
# the runner (torch, the model) is imported when the command runs.

out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 140)


def _csv(value: str, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise InputError(f"--{what} is empty")
    return items


def parse_options(raw: tuple[str, ...], methods: list[str] | None = None) -> dict[str, dict[str, str]]:
    """``METHOD.KEY=VALUE`` (or ``KEY=VALUE`` with a single method) → {method: {key: value}}."""
    options: dict[str, dict[str, str]] = {}
    for item in raw:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InputError(f"--option {item!r} must look like METHOD.KEY=VALUE (e.g. ig.steps=50)")
        method, dot, key = name.rpartition(".")
        if not dot:
            if not methods or len(methods) != 1:
                raise InputError(f"--option {item!r}: name the method, e.g. ig.{name}={value}")
            method, key = methods[0], name
        options.setdefault(method, {})[key] = value
    return options


class TerminalListener(Listener):
    """The runner's notes and progress in the terminal (a rich progress bar on stderr)."""

    def __init__(self, console: Console):
        self.console = console
        self.progress: Progress | None = None
        self.task = None

    def note(self, text: str, level: str = "info") -> None:
        self.console.print(f"[red]{text}[/]" if level == "error" else f"[dim]{text}[/]")

    def start(self, total: int, pairs: str) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[pairs]}"),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        self.progress = Progress(*columns, console=self.console)
        self.progress.start()
        self.task = self.progress.add_task("evaluating", total=total, pairs=pairs)

    def method(self, name: str) -> None:
        self.progress.update(self.task, description=f"{name:>12}")

    def advance(self, tokens: int, pairs: str) -> None:
        self.progress.update(self.task, advance=tokens, pairs=pairs)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def render_table(summary, metrics: list[M.Metric], title: str = "") -> Table:
    """Methods × metrics, mean ± half the 95% interval; the best mean per metric in bold."""
    from ..evaluate.summary import TIMING, header, table_rows
    t = Table(title=title or f"faithfulness on {summary.n_examples} examples (mean ± 95% CI half-width)",
              caption=TIMING + (f"; {summary.skipped} texts skipped, under the protocol's minimum length"
                                if getattr(summary, "skipped", 0) else ""))
    shown, rows = table_rows(summary, metrics, lambda s: f"{s['mean']:.3f} ± {(s['high'] - s['low']) / 2:.3f}",
                             lambda text: f"[bold]{text}[/]")
    t.add_column("method", overflow="fold")
    t.add_column("scores", overflow="fold")
    for m in shown:                 # folded, never cut, on a narrow terminal (a metric's name is its meaning)
        t.add_column(header(m), justify="right", overflow="fold")
    t.add_column("explained/min", justify="right", overflow="fold")
    t.add_column("evaluated/min", justify="right", overflow="fold")
    for method, cells in rows:
        tp = summary.throughput.get(method, {})
        t.add_row(method, summary.scores.get(method, ""), *cells, f"{tp.get('explain_per_minute', 0):.0f}", f"{tp.get('evaluated_per_minute', 0):.1f}")
    return t


def render_paired(result, title: str = "") -> Table:
    """Pairs × metrics: the mean difference A − B per text and its 95% bootstrap interval."""
    from ..evaluate import paired
    metrics = list(next(iter(result.values()))) if result else []
    t = Table(title=title or "paired differences A − B per text, mean [95% bootstrap interval]",
              caption="↑/↓: higher/lower is better, so a difference on that side favours A; texts: those both scored")
    t.add_column("A − B")
    t.add_column("texts", justify="right")
    for m in metrics:
        t.add_column(f"{m} {M.METRICS.get(m).direction()}", justify="right", overflow="fold")
    for pair, cells in result.items():
        t.add_row(pair, paired.texts(cells), *(paired.cell(cells[m]) for m in metrics))
    return t


def given_settings(settings: dict) -> dict:
    """The metric options given on the command line (the others stay unset, so that the
    protocol's, e.g. ali2022's steps = 10, or the declared default applies)."""
    ctx = click.get_current_context()
    return {k: v for k, v in settings.items()
            if ctx.get_parameter_source(k) not in (click.core.ParameterSource.DEFAULT, None)}


def metric_options(command):
    """The metrics' declared options as click options (``aopc_k`` → ``--aopc-k``), in registration order."""
    for o in reversed(list(M.all_options().values())):
        command = click.option(o.flag, o.name, type=Bounded(o.type, o.low, o.high), default=o.default,
                               show_default=True,  # given or not: see given_settings (a protocol may set it)
                               help=f"{o.help} ({o.range()})")(command)
    return command


@click.command("evaluate")
@model_argument
@click.option("--data", "data", required=True, type=click.Path(path_type=Path), metavar="FILE",
              help="CSV, JSON lines or Parquet with a `text` column, optional `label` (index or class name) and "
                   "`answer` (span QA)")
@click.option("--methods", "methods", required=True, metavar="A,B,…",
              help="methods to compare (see `rulegraph methods`): baselines and rule sets")
@click.option("--metrics", "metric_names", default=None, metavar="A,B,…",
              help=f"any of {', '.join(M.METRICS)} (default: the protocol's, else {','.join(M.defaults())})")
@click.option("--tokenizer", type=click.Path(path_type=Path), metavar="PATH",
              help="tokenizer.json (default: the one next to the model)")
@click.option("--n", "n", type=Bounded(int, 1), default=None, help="evaluate the first N texts of the file (default: all; ≥ 1)")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("rulegraph-eval"), show_default=True,
              help="folder for results.jsonl (resumable), table.csv, summary.json and the PNG plots")
@click.option("--protocol", "protocol_name", type=click.Choice(P.PROTOCOLS.names()), default="default",
              show_default=True,
              help="an evaluation protocol preset; each field below overrides it. "
                   + " ".join(f"{name}: {p.description}" for name, p in P.PROTOCOLS.items()))
@click.option("--removal", type=click.Choice(REMOVALS), default=None,
              help="removed tokens become [MASK] ([UNK] if the vocabulary has none), [UNK], [PAD], or are deleted; "
                   "special tokens are never removed; AUAC starts from [UNK] (default: the protocol's; default "
                   "protocol: mask)")
@click.option("--aopc-grid", "aopc_grid", metavar="K1,K2,…",
              help="AOPC over exactly these % (e.g. 10,20,30,40,50; k = 0 only if listed) instead of 0…--aopc-k "
                   "in --aopc-step steps (default: the protocol's)")
@click.option("--count", "count_rule", type=click.Choice(P.COUNTS), default=None,
              help="tokens removed at fraction k of L: round-half-up ⌊kL+½⌋, round (Python's, half to even), "
                   "floor, ceil (default: the protocol's; default protocol: round-half-up)")
@click.option("--min-count", type=Bounded(int, 0), default=None,
              help="at least this many tokens removed at every k > 0 (default: the protocol's; default protocol: 0)")
@click.option("--min-length", type=Bounded(int, 0), default=None,
              help="skip texts of fewer tokens ([CLS]/[SEP] included), counted in the output "
                   "(default: the protocol's; default protocol: 0)")
@click.option("--score", "score", type=click.Choice(P.MEASURES), default=None,
              help="AOPC's drops of the explained class's probability, logit or log-odds "
                   "(default: the protocol's; default protocol: probability)")
@click.option("--option", "-o", "raw_options", multiple=True, metavar="METHOD.KEY=VALUE",
              help="a method option, e.g. ig.steps=50, loo.mode=delete, lrp-ah-ln.score=logprob (repeatable)")
@click.option("--paired", "pairs", metavar="A-B,C-D,…",
              help="also report paired differences A − B per text (mean, 95% bootstrap interval over the texts both "
                   "scored) for these pairs of --methods; written to OUT/paired.csv and summary.json")
@metric_options
@click.option("--seed", type=Bounded(int, 0, 2**32 - 1), default=0, show_default=True,
              help="seed of the random baseline and the bootstrap (0…2³²−1)")
@click.option("--batch", type=Bounded(int, 1, 65536), default=16, show_default=True,
              help="examples explained together (1…65536)")
@click.option("--batch-tokens", type=Bounded(int, 1, 2**24), default=8192, show_default=True,
              help="padded tokens per forward batch (1…2²⁴)")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--runtime", type=click.Choice(RUNTIMES), default="auto", show_default=True,
              help="what runs the metrics' perturbed forwards: onnxruntime (auto: for an .onnx model on the CPU "
                   "in float32) or the rulegraph interpreter (loo has its own -o loo.runtime)")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True)
@click.option("--threads", type=Bounded(int, 1, 1024), default=None, help="torch CPU threads (default: torch's choice; 1…1024)")
@engine_options
@click.option("--force", is_flag=True, help="discard results already in --out and start over")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
@click.option("--report-only", is_flag=True, help="evaluate nothing more: the table of the results already in --out")
def evaluate_cmd(model, data, methods, metric_names, tokenizer, n, out_dir, protocol_name, removal, aopc_grid,
                 count_rule, min_count, min_length, score, raw_options, pairs, seed, batch, batch_tokens, device, runtime,
                 dtype, threads, engine_name, address, num_workers, cpus_per_worker, gpus_per_worker, force, quiet,
                 report_only, **metric_settings):
    """Faithfulness of explanation METHODS for MODEL on the texts of --data: AOPC, LOdds, AUAC,
    AU-MSE, hiding / revealing games, accuracy vs words deleted (and Precision@k for span QA).

    Resumable: results go to OUT/results.jsonl one line per text × method, and a re-run
    with the same settings continues where it stopped (more --methods or a larger --n
    only add what is missing). Prints the table (mean and 95% bootstrap interval) and
    writes OUT/table.csv, OUT/summary.json, OUT/curves.png and OUT/conservation.png."""
    if Path(data).is_dir():
        raise InputError(f"--data {data} is a directory; give a CSV, JSON lines or Parquet file with a `text` column")
    if not Path(data).is_file():
        raise InputError(f"data file not found: {data}")
    check_folder(Path(out_dir), "--out")
    protocol = P.resolve(protocol_name, removal=removal, grid=P.parse_grid(aopc_grid), count=count_rule,
                         min_count=min_count, min_length=min_length, score=score)
    import torch
    from ..evaluate.runner import Config, Evaluation
    if threads:
        torch.set_num_threads(threads)
    method_names = _csv(methods, "methods")
    if len(set(method_names)) != len(method_names):
        raise InputError("--methods lists a method twice")
    config = Config(
        model=str(model), data=str(data), methods=method_names,
        metrics=_csv(metric_names, "metrics") if metric_names is not None else list(protocol.metrics or M.defaults()),
        tokenizer=str(tokenizer) if tokenizer else None, options=parse_options(raw_options, method_names),
        removal=protocol.removal, settings=given_settings(metric_settings), seed=seed, n=n,
        device=device, runtime=runtime, dtype=dtype, batch=batch, batch_tokens=batch_tokens,
        protocol=protocol_name, grid=list(protocol.grid) if protocol.grid is not None else None,
        count=protocol.count, min_count=protocol.min_count, min_length=protocol.min_length, score=protocol.score)
    engine = make_engine(engine_name, address, num_workers, cpus_per_worker, gpus_per_worker)
    evaluation = Evaluation(config, out_dir, force=force, listener=TerminalListener(err), progress=not quiet,
                            engine=engine, pairs=pairs)
    summary = evaluation.run(compute=not report_only)
    metrics = M.build(config.metrics, M.Removal(protocol.removal), evaluation.settings, evaluation.metric_protocol())
    out.print(escape(summary.protocol), soft_wrap=True)
    out.print(render_table(summary, metrics))
    if summary.paired:
        out.print(render_paired(summary.paired))
    for name, f in summary.failed.items():
        err.print(f"[red]{name}: failed on {f['texts']} of {f['of']} texts, left out of its figures "
                  f"(first error: {escape(f['error'])})[/]", soft_wrap=True)
    err.print(f"[dim]wrote {out_dir}/results.jsonl, results.parquet, table.csv, summary.json, curves.png, conservation.png"
              f"{', paired.csv' if summary.paired else ''}; "
              "interval: 95% percentile bootstrap over examples[/]")
