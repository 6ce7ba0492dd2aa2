"""rulegraph — explain exported networks with declarative propagation rules, and audit
conservation layer by layer.

    import rulegraph
    e = rulegraph.explain("model.onnx", "lrp-ah-ln", text="a gorgeous, witty movie")
    e.tokens[0], e.scores(), e.audit.conservation.residual

    graph = rulegraph.load("model.onnx")                 # or a torch.export program
    rules = rulegraph.RuleSet.load("lrp-ah-ln")          # or a path to your YAML
    e = rulegraph.explain(graph, rules, {"input_ids": ids, "attention_mask": mask})

The names below are imported when first used, so ``import rulegraph`` (and the command
line's ``--help``) does not load torch.
"""
from __future__ import annotations

import importlib
from typing import Any

#: public name → the module defining it
_PUBLIC = {
    "Explanation": "explanation", "Graph": "ir", "RuleSet": "ruleset", "RulegraphError": "errors",
    "encode": "api", "explain": "api", "generate": "generation", "load": "loaders", "prepare": "interpreter", "run": "interpreter",
    "shipped_rule_sets": "ruleset", "Generation": "generation", "Targets": "explanation",
}

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'rulegraph' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
