"""rulegraph — explain exported networks with declarative propagation rules, and audit
conservation layer by layer.

    import rulegraph
    e = rulegraph.explain("model.onnx", "lrp-ah-ln", text="a gorgeous, witty movie")
    e.tokens[0], e.scores(), e.audit.conservation.residual

    graph = rulegraph.load("model.onnx")                 # or a torch.export program
    rules = rulegraph.RuleSet.load("lrp-ah-ln")          # or a path to your YAML
    e = rulegraph.explain(graph, rules, {"input_ids": ids, "attention_mask": mask})
"""
from .errors import RulegraphError
from .explain import encode, explain
from .explanation import Explanation
from .interpreter import prepare, run
from .ir import Graph
from .loaders import load
from .ruleset import RuleSet, shipped_rule_sets

__all__ = ["Explanation", "Graph", "RuleSet", "RulegraphError", "encode", "explain", "load", "prepare", "run",
           "shipped_rule_sets"]
__version__ = "0.1.0"
