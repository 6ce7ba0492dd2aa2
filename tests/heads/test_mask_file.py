"""The mask file's parser: errors name file:line and list the valid choices."""
from __future__ import annotations

import pytest

from rulegraph.errors import InputError
from rulegraph.heads import parse_masks


@pytest.mark.parametrize("text, where, says", [
    ("heads:\n  0: [positional, nope]\n", ":2", "head type 'nope' is not valid"),
    ("heads:\n  0: [positional]\nblocks: 3\n", ":3", "unknown key 'blocks'"),
    ("heads:\n  x: [none]\n", ":2", "block 'x' must be a block number"),
    ("heads:\n  0: [none]\n  0: [none]\n", ":3", "listed twice"),
    ("model: m\n", ":1", "missing `heads:`"),
    ("heads: [1, 2]\n", ":1", "must map block numbers"),
    ("heads:\n  0: [positional\n", "", "not valid YAML"),
])
def test_mask_file_errors(text, where, says):
    with pytest.raises(InputError) as info:
        parse_masks(text, "m.yaml")
    message = str(info.value)
    assert message.startswith(f"m.yaml{where}:") and says in message
    if "not valid;" in message or "unknown key" in message:
        assert "positional" in message or "heads" in message      # the valid choices are listed


def test_mask_file_reads_json_and_checks_head_count():
    masks = parse_masks('{"heads": {"0": ["positional", "none"], "1": ["syntactic", "none"]}}', "m.json")
    assert masks.types == {0: ("positional", "none"), 1: ("syntactic", "none")} and masks.rate == 0.5
    assert masks.of(5, 4) is None
    with pytest.raises(InputError, match="block 0 lists 2 heads, the graph's has 4"):
        masks.of(0, 4)


def test_rule_file_reports_bad_inline_mask():
    from rulegraph.errors import RuleFileError
    from rulegraph.ruleset import RuleSet
    text = "name: x\nrules:\n  - op: MatMul\n    rule: head-mask\n    params: {inline: {0: [positional, bogus]}}\n"
    with pytest.raises(RuleFileError, match=r"<string>:5: .*head type 'bogus' is not valid"):
        RuleSet.from_yaml(text)


@pytest.mark.parametrize("text, says", [("heads: {}\n", "names no block"),
                                        ("heads:\n  0: [positional, syntactic]\n", "keeps every head")])
def test_a_mask_that_masks_nothing_is_said(text, says):
    from rulegraph.heads import parse_masks
    with pytest.warns(UserWarning, match=f"m.yaml: the head mask {says}"):
        parse_masks(text, "m.yaml")
