"""``rulegraph tune``: a rule file searched for faithfulness on the user's model and data, chosen on
data the search never saw and reported once on data neither saw.

:mod:`.space` reads a search space (which rules and param ranges per rule-file entry) and writes a
trial's choice as a rule file; :mod:`.split` splits the data once into tune / validation / test;
:mod:`.search` runs Optuna's TPE with its study in SQLite (a stopped run resumes); :mod:`.runner`
ties them to the evaluation (:mod:`rulegraph.evaluate`) and writes the outputs; :mod:`.plots` draws
the trials. Optuna is an optional package: ``pip install "rulegraph[tune]"``.
"""
