"""Declared options (rulegraph.options): a flag written as text is read as what it says."""
from __future__ import annotations

import pytest

from rulegraph.errors import InputError
from rulegraph.options import RULE_SET_OPTIONS, Option


@pytest.mark.parametrize("text, value", [("true", True), ("True", True), ("yes", True), ("1", True),
                                         ("false", False), ("FALSE", False), ("no", False), ("0", False)])
def test_a_flag_given_as_text_reads_as_it_says(text, value):
    """``-o attnlrp.replay=false`` is false (``bool("false")`` would be true)."""
    replay = next(o for o in RULE_SET_OPTIONS if o.name == "replay")
    assert replay.parse(text, "option attnlrp.replay") is value


def test_a_flag_given_other_text_is_refused():
    with pytest.raises(InputError, match=r"option m\.flag must be bool, got 'maybe'"):
        Option("flag", bool, False, "a flag").parse("maybe", "option m.flag")
