"""The search: Optuna's TPE over a search space, its study in SQLite so that a stopped run resumes.

Tree-structured Parzen estimators (Bergstra et al. 2011, "Algorithms for hyper-parameter
optimization", NeurIPS) as Optuna implements them (Akiba et al. 2019, "Optuna: a next-generation
hyperparameter optimization framework", KDD), with its median pruner optional. Deterministic
under a seed, resumed or not: a trial still marked running in the study when a run starts was
stopped with its run (killed); it is marked failed and left out of the count (TPE learns from
finished trials only), and the n-th counted trial's sampler is seeded with ``seed + n``, so a run
stopped and resumed samples the trials an unstopped run samples.
"""
from __future__ import annotations

from typing import Any, Callable

from ..errors import InputError, MissingDependency, RulegraphError
from .space import Space

#: the study's name in its SQLite file
STUDY = "rulegraph-tune"
#: the study's user attribute listing the trials stopped with their run
INTERRUPTED = "interrupted"


def optuna():
    """Optuna, or an error naming the extra that installs it."""
    try:
        import optuna as module
    except ImportError as exc:
        raise MissingDependency.of(exc) or exc from None
    module.logging.set_verbosity(module.logging.WARNING)
    return module


def open_study(storage: str, direction: str, identity: dict[str, Any], pruner: bool = False,
               equivalent: dict[str, str] | None = None):
    """The study in ``storage`` (``sqlite:///PATH``), created or resumed; a study of other settings
    (``identity``: what decides its numbers) is refused. ``equivalent``: key → a key that decides for it: a
    held value of the first that differs is accepted where the second's agrees (a rule file's text and the
    rules it binds), and a study that holds no value of the second (recorded before it was) is judged by
    the first alone. A study resumed so records the identity given."""
    o = optuna()
    study = o.create_study(storage=o.storages.RDBStorage(storage), study_name=STUDY, direction=direction,
                           load_if_exists=True, pruner=o.pruners.MedianPruner(n_startup_trials=2)
                           if pruner else o.pruners.NopPruner())
    held = study.user_attrs.get("identity")
    if held is not None and held != identity:
        equivalent = equivalent or {}
        changed = {k for k in set(held) | set(identity) if held.get(k) != identity.get(k)}
        changed -= {k for k, by in equivalent.items() if by in held and held[by] == identity.get(by)}
        changed -= {by for by in equivalent.values() if by not in held}
        if changed:
            raise InputError(f"the study in {storage.removeprefix('sqlite:///')} was run with other settings "
                             f"({', '.join(sorted(changed))} differ); give another --out, or --force to start over")
    if study.direction.name.lower() != direction:
        raise InputError(f"the study in {storage} maximizes the other way; --force to start over")
    if held != identity:
        study.set_user_attr("identity", identity)
    return study


def stale(study) -> list[int]:
    """Mark the trials a stopped run left running as failed, and list them in the study's
    :data:`INTERRUPTED`; their numbers."""
    o = optuna()
    found = [t.number for t in study.get_trials(deepcopy=False, states=(o.trial.TrialState.RUNNING,))]
    for number in found:
        study.tell(number, state=o.trial.TrialState.FAIL)
    if found:
        study.set_user_attr(INTERRUPTED, sorted({*interrupted(study), *found}))
    return found


def interrupted(study) -> list[int]:
    """The trials stopped with their run (:func:`stale`)."""
    return list(study.user_attrs.get(INTERRUPTED, []))


def counted(study) -> int:
    """The trials that count toward ``--trials``: finished (complete or pruned), or failed by their
    rule set (an error, recorded); not those a stopped run left behind."""
    o = optuna()
    states, stopped = o.trial.TrialState, set(interrupted(study))
    return sum(t.state in (states.COMPLETE, states.PRUNED) or (t.state == states.FAIL and t.number not in stopped)
               for t in study.get_trials(deepcopy=False))


def optimize(study, space: Space, objective: Callable[[Any, dict], float], trials: int, seed: int,
             on_trial: Callable[[Any], None] | None = None) -> None:
    """Run trials until ``trials`` count (:func:`counted`): each samples a choice from ``space`` and
    is scored by ``objective(trial, choice)``; a :class:`~rulegraph.errors.RulegraphError` fails that
    trial (recorded as its ``error``) and the search goes on. ``on_trial``: called after each."""
    o = optuna()
    stale(study)
    while (done := counted(study)) < trials:
        number = len(study.trials)
        study.sampler = o.samplers.TPESampler(seed=seed + done)
        trial = study.ask()
        try:
            value = objective(trial, space.sample(trial))
        except o.TrialPruned:
            study.tell(trial, state=o.trial.TrialState.PRUNED)
        except RulegraphError as exc:
            trial.set_user_attr("error", str(exc))
            study.tell(trial, state=o.trial.TrialState.FAIL)
        else:
            study.tell(trial, value)
        if on_trial is not None:
            on_trial(study.trials[number])


def finished(study) -> list:
    """The complete trials, best first (ties: the earlier)."""
    o = optuna()
    done = [t for t in study.get_trials(deepcopy=False, states=(o.trial.TrialState.COMPLETE,))]
    sign = -1 if study.direction == o.study.StudyDirection.MAXIMIZE else 1
    return sorted(done, key=lambda t: (sign * t.value, t.number))
