"""The rule sets shipped with rulegraph (YAML files in this folder), loadable by name:
``RuleSet.load("lrp-ah-ln")``. See each file's description, and the README's
rule-file walkthrough for the schema. Listing them needs nothing but this folder."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml


def shipped_rule_sets(models: str | None = "transformers") -> dict[str, Path]:
    """Name → path of the shipped rule sets written for ``models`` (``transformers``,
    ``cnns``; ``None``: all) — a rule file's ``models:`` key — in name order."""
    return {k: v for k, v in _named(resources.files(__name__)) if models is None or _models(v) == models}


def shipped_spaces() -> dict[str, Path]:
    """Name → path of the search spaces shipped in ``spaces/`` (``rulegraph tune --space NAME``), in name order."""
    return dict(_named(resources.files(__name__).joinpath("spaces")))


def _named(folder) -> list[tuple[str, Path]]:
    """The YAML files in ``folder`` (a package resource folder) as (name, path), in name order."""
    return sorted((Path(p.name).stem, Path(str(p))) for p in folder.iterdir() if p.name.endswith(".yaml"))


def _models(path: Path) -> str:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return str(doc.get("models", "transformers")) if isinstance(doc, dict) else "transformers"
