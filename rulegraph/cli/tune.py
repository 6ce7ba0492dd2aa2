"""``rulegraph tune``: a rule file searched for faithfulness on a model and data, proven on held-out texts."""
from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ..errors import InputError
from ..evaluate import metrics as M
from ..evaluate import protocols as P
from ..files import check_outputs
from .console import err, out
from .evaluate import given_settings, metric_options
from .options import Bounded, check_folder, engine_options, make_engine, model_argument

# Only light modules above (no torch, no optuna): `rulegraph tune --help` loads fast; the runner is
# imported when the command runs.


@click.command("tune")
@model_argument
@click.option("--data", "data", required=True, type=click.Path(path_type=Path), metavar="FILE",
              help="CSV, JSON lines or Parquet with a `text` column and optional `label`; split once into tune / "
                   "validation / test by a seeded hash of each text")
@click.option("--from", "start", required=True, metavar="NAME|PATH",
              help="the starting rule set (a shipped one, or a YAML rule file): the tuned file is derived from it, "
                   "and compared with it on the test part")
@click.option("--protocol", "protocol_name", type=click.Choice(P.PROTOCOLS.names()), default="default",
              show_default=True, help="the evaluation protocol (as rulegraph evaluate's), e.g. mask-10-50")
@click.option("--metric", required=True, type=click.Choice(list(M.METRICS)),
              help="the metric searched on (its direction decides: higher or lower is better)")
@click.option("--against", "against", metavar="A,B,…",
              help="also compare the tuned set with these rule sets on the test part (e.g. the best shipped one): "
                   "paired differences with their 95% bootstrap intervals")
@click.option("--space", type=click.Path(path_type=Path), metavar="SPACE.yaml|NAME",
              help="the search space: a YAML file, or the name of one shipped in rulegraph/rules/spaces/ "
                   "(transformers, transformers-dense, cnns; default: the one for the starting rule set's models:)")
@click.option("--trials", type=Bounded(int, 1, 100000), default=20, show_default=True,
              help="trials the study should hold (a re-run with the same --out resumes up to this many; 1…100000)")
@click.option("--seed", type=Bounded(int, 0, 2**31 - 1), default=0, show_default=True,
              help="seed of the split, the sampler and the bootstrap (0…2³¹−1)")
@click.option("--split", "split_spec", default="60,20,20", show_default=True, metavar="T,V,S",
              help="shares of the texts in the tune, validation and test parts")
@click.option("--finalists", type=Bounded(int, 1, 1000), default=3, show_default=True,
              help="best trials on the tune part scored on the validation part (1…1000)")
@click.option("--conserving", is_flag=True,
              help="only rules that conserve; a trial whose rules break conservation is flagged, not chosen")
@click.option("--max-leak", type=Bounded(float, 0, 100), default=0.5, show_default=True,
              help="flag a trial whose constants absorb more than this share of the explained value (0…100)")
@click.option("--audit-texts", type=Bounded(int, 1, 1000), default=4, show_default=True,
              help="tune texts each trial's conservation is audited on (1…1000)")
@click.option("--prune", is_flag=True, help="median pruning: a trial behind the median on half the tune part stops")
@click.option("--tokenizer", type=click.Path(path_type=Path), metavar="PATH",
              help="tokenizer.json (default: the one next to the model)")
@metric_options
@click.option("--batch", type=Bounded(int, 1, 65536), default=16, show_default=True,
              help="examples explained together (1…65536)")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True)
@click.option("--threads", type=Bounded(int, 1, 1024), default=None, help="torch CPU threads (1…1024)")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), metavar="DIR",
              help="folder of the study (resumable), the split, the trials, tuned.yaml, trials.parquet, trials.png")
@click.option("--force", is_flag=True, help="discard the study and trials already in --out and start over")
@engine_options
def tune_cmd(model, data, start, protocol_name, metric, against, space, trials, seed, split_spec, finalists, conserving,
             max_leak, audit_texts, prune, tokenizer, batch, device, dtype, threads, out_dir, force, engine_name,
             address, num_workers, cpus_per_worker, gpus_per_worker, **metric_settings):
    """Search a rule file for MODEL that scores best on --metric: the texts of --data split once
    into tune / validation / test, Optuna's TPE searching the space on tune, the best --finalists
    chosen among on validation, and one report on test with the paired difference against --from
    (95% bootstrap interval).

    Writes DIR/tuned.yaml (a rule file like any other, its header saying what it was tuned on and
    the test figures), DIR/trials.parquet, DIR/trials.png and DIR/tune.json; the study is in
    DIR/study.db, so a stopped run resumes where it was (the same command again). With --engine ray
    each trial's texts are explained and scored on Ray workers; the search itself stays here."""
    from ..tune.split import fractions
    if Path(data).is_dir():
        raise InputError(f"--data {data} is a directory; give a file")
    if not Path(data).is_file():
        raise InputError(f"--data file not found: {data}")
    check_folder(Path(out_dir), "--out")
    from ..tune.runner import OUTPUTS, Settings, TuneListener, Tuning
    check_outputs([(Path(out_dir) / name, f"--out's {name}") for name in OUTPUTS], True,
                  [model, data, tokenizer, space, start])
    settings = Settings(model=str(model), data=str(data), start=str(start), metric=metric, out=str(out_dir),
                        protocol=protocol_name, space=str(space) if space else None, trials=trials, seed=seed,
                        split=fractions(split_spec), finalists=finalists, conserving=conserving, max_leak=max_leak,
                        audit_texts=audit_texts, prune=prune, tokenizer=str(tokenizer) if tokenizer else None,
                        batch=batch, device=device, dtype=dtype, force=force,
                        settings=given_settings(metric_settings),
                        against=[a.strip() for a in against.split(",") if a.strip()] if against else [])
    if threads:
        import torch
        torch.set_num_threads(threads)

    class Terminal(TuneListener):
        def note(self, text: str, level: str = "info") -> None:
            style = {"error": "red", "warning": "yellow"}.get(level, "dim")
            err.print(f"[{style}]{escape(text)}[/]", soft_wrap=True)

        def trial(self, number, value, state, params, flag, error):
            shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
            figure = f"{metric} {value:.4g}" if value is not None else state
            why = f" [red]flagged: {escape(flag)}[/]" if flag else f" [red]failed: {escape(error)}[/]" if error else ""
            err.print(f"trial {number}: {figure}  [dim]{escape(shown)}[/]{why}", soft_wrap=True)

    engine = make_engine(engine_name, address, num_workers, cpus_per_worker, gpus_per_worker)
    engine.check(device)
    result = Tuning(settings, Terminal(), engine=engine).run()
    t = result.test
    start_label = next(k for k in t if k != f"trial-{result.trial}")
    p = result.paired
    out.print(f"tuned: trial {result.trial} (tune {result.tune:.4g}, validation {result.validation[result.trial]:.4g})",
              soft_wrap=True)
    out.print(f"test ({result.sizes['test']} texts): tuned {t[f'trial-{result.trial}'].get('mean', float('nan')):.4g}, "
              f"{escape(str(start))} {t[start_label].get('mean', float('nan')):.4g}; paired difference "
              f"{p['mean']:+.4g} [95% bootstrap {p['low']:+.4g}, {p['high']:+.4g}] over {p['n']} texts", soft_wrap=True)
    for label, d in result.against.items():
        out.print(f"test: tuned − {escape(label)} {d['mean']:+.4g} [95% bootstrap {d['low']:+.4g}, {d['high']:+.4g}] "
                  f"over {d['n']} texts", soft_wrap=True)
    if result.flagged:
        err.print(f"[red]flagged trials (not chosen): {', '.join(map(str, sorted(result.flagged)))} — see "
                  f"{out_dir}/trials.parquet[/]", soft_wrap=True)
    err.print(f"[dim]wrote {out_dir}/tuned.yaml, trials.parquet, trials.png, tune.json; study in {out_dir}/study.db[/]")
