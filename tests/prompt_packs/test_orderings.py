"""Order averaging: expansion into orderings and the combined result."""

from __future__ import annotations

import pytest

from prompt_packs.orderings import choice_orders, combine_orderings, expand_orderings

TEMPLATE = "\n\nTopic?\n{choices}\nAnswer:{?}"


def test_rotations_put_every_choice_under_every_letter():
    orders = choice_orders(4, "rotations")
    assert len(orders) == 4
    for letter in range(4):
        assert sorted(order[letter] for order in orders) == [0, 1, 2, 3]


def test_all_is_every_permutation_and_refuses_five_choices():
    assert len(set(choice_orders(4, "all"))) == 24
    with pytest.raises(ValueError, match="at most 4"):
        choice_orders(5, "all")


def test_expand_orderings_renders_the_rotated_choices_and_escapes_braces():
    expanded = expand_orderings("t", TEMPLATE, ["sport", "tech {ai}", "politics"], "rotations")
    queries = [q for q, _ in expanded]
    assert [q.id for q in queries] == ["t", "t~o1", "t~o2"]
    assert queries[0].options == [" A", " B", " C"]
    assert "A) sport\nB) tech {{ai}}\nC) politics" in queries[0].template
    assert "A) tech {{ai}}\nB) politics\nC) sport" in queries[1].template


def test_combine_maps_letters_back_to_choices():
    expanded = expand_orderings("t", TEMPLATE, ["x", "y", "z"], "rotations")
    orderings = [o for _, o in expanded]
    # the model always prefers letter A: a pure position bias, no content signal
    letter_probs = [[0.6, 0.3, 0.1]] * 3
    combined = combine_orderings(orderings, letter_probs)
    assert combined.probabilities == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert combined.agreement == pytest.approx(1 / 3)
    assert combined.spread == pytest.approx(0.5)
    assert combined.per_ordering[1]["probabilities"] == pytest.approx([0.1, 0.6, 0.3])


def test_combine_of_an_order_free_model_is_unanimous():
    expanded = expand_orderings("t", TEMPLATE, ["x", "y", "z"], "all")
    orderings = [o for _, o in expanded]
    truth = [0.2, 0.7, 0.1]  # p per choice whatever its letter
    letter_probs = [[truth[c] for c in o.choice_order] for o in orderings]
    combined = combine_orderings(orderings, letter_probs)
    assert combined.probabilities == pytest.approx(truth)
    assert combined.top == 1 and combined.agreement == 1.0 and combined.spread == pytest.approx(0.0)
    assert combined.as_dict(["x", "y", "z"])["top"] == "y"


def test_template_needs_the_choices_marker_once():
    with pytest.raises(ValueError, match="exactly once"):
        expand_orderings("t", "\n\nTopic?\nAnswer:{?}", ["a", "b"])
