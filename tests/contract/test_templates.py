import re

import pytest

from contract.templates import Placeholder, TemplateError, expand_grid, parse_template


def test_option_slot_ends_template_and_placeholders_fill():
    parsed = parse_template("\n\nDoes it mention {brand}?{?}")
    assert parsed.slot == "?"
    assert parsed.pieces == ("\n\nDoes it mention ", Placeholder("brand"), "?")
    assert parsed.fill({"brand": "Visa"}) == "\n\nDoes it mention Visa?"


def test_literal_braces_are_unescaped():
    parsed = parse_template('{{"label": "{?}')
    assert parsed.fill({}) == '{"label": "'


@pytest.mark.parametrize(
    "template, message",
    [
        ("no slot here", "no slot"),
        ("{?} trailing", "text after {?}"),
        ("{?}{?}", "two slots"),
        ("{*} and {?}", "two slots"),
        ("a { b {?}", "unmatched"),
        ("{bad name}{?}", "neither a slot"),
    ],
)
def test_bad_templates_say_what_is_wrong(template, message):
    with pytest.raises(TemplateError, match=re.escape(message)):
        parse_template(template)


def test_extraction_slot_keeps_its_tail():
    parsed = parse_template('A: "{*}"')
    assert parsed.slot == "*" and parsed.tail == '"'


def test_grid_is_cartesian_in_order():
    grid = expand_grid(("a", "b"), {"a": ["1", "2"], "b": ["x", "y"]})
    assert grid == [{"a": "1", "b": "x"}, {"a": "1", "b": "y"}, {"a": "2", "b": "x"}, {"a": "2", "b": "y"}]
