"""Faithfulness evaluation: explain a data set with several methods, perturb the texts as a
protocol says, score each explanation with the metrics, and aggregate with bootstrap intervals.

:mod:`.protocols` (removal token, AOPC grid, counting rule: presets), :mod:`.metrics` (one file
per metric), :mod:`.runner` (an evaluation as a dataset run of :mod:`rulegraph.scale` whose
worker also scores), :mod:`.plots`.
"""
