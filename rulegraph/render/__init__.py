"""Showing results, one implementation for the command line, notebooks and files: token colours
and reader-friendly token text (:mod:`.colour`), self-contained HTML (:mod:`.page`: an
explanation, a generation's matrix, an image with its heatmap) and matplotlib figures
(:mod:`.figure`). ``Explanation`` and ``Generation`` show themselves with these
(``_repr_html_``, ``to_html``, ``plot``); the command line's terminal tables are in
``rulegraph.cli.render``."""
