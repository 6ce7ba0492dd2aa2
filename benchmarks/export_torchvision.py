"""Export torchvision ResNet-18, VGG-11 and ViT-B/16 (random weights) to ONNX under
``.cache/torchvision-onnx`` and print `rulegraph check`'s coverage with the shipped rule sets.

Run in the peers environment (torchvision is not a rulegraph dependency)::

    .peers/bin/python benchmarks/export_torchvision.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_peers_torchvision import CASES, export  # noqa: E402

import rulegraph  # noqa: E402
from rulegraph.ruleset import RuleSet  # noqa: E402

for name, rules in CASES:
    graph = rulegraph.load(str(export(name)))
    binding = (RuleSet.load(rules)).bind(graph)
    print(f"{name:10s} {rules:18s} {len(graph.nodes):5d} nodes, {len(binding.reached):5d} reached, "
          f"{len(binding.unmatched)} unmatched")
