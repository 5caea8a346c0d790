import pytest
from pydantic import ValidationError

from contract.protocol import ScoringRequest, ScoringSpec
from contract.templates import parse_template


def request(**query):
    base = {"id": "q", "template": "Answer:{?}", "options": [" yes", " no"]}
    base.update(query)
    return {"messages": [{"role": "user", "content": "hello"}], "scoring": {"queries": [base]}}


def test_valid_request_parses():
    parsed = ScoringRequest.model_validate(request())
    assert parsed.scoring.queries[0].answer_in == "user"


@pytest.mark.parametrize(
    "query, field_fragment",
    [
        ({"options": [" yes"]}, "at least 2 options"),
        ({"options": [" yes", " yes"]}, "duplicate option"),
        ({"options": [" yes", ""]}, "an option is empty"),
        ({"options": [str(i) for i in range(256)]}, "at most 255"),
        ({"template": "no slot"}, "no slot"),
        ({"template": "{?}{?}"}, "two slots"),
        ({"template": "Q {x}?{?}"}, "have no values"),
        ({"values": {"x": ["1"]}}, "not used in the template"),
        ({"template": 'A: "{*}"'}, "takes no options"),
        ({"template": "A: {*}", "options": []}, "needs closing text"),
        ({"template": "A:{n}", "options": [], "mode": "generate"}, "needs the {*} slot"),
        ({"template": 'A: "{*}"', "options": [], "seed": 1}, "only mode 'generate' samples"),
        ({"template": 'A: "{*}"', "options": [], "mode": "generate", "beam_width": 3}, "beam_width"),
        ({"template": 'A: "{*}"', "options": [], "beam_width": 0}, "beam_width"),
        ({"template": 'A: "{*}"', "options": [], "max_tokens": 100000}, "max_tokens"),
        ({"template": 'A: "{*}" {n}', "options": []}, "two slots"),
        ({"beam_width": 3}, "only extraction slots"),
        ({"mode": "generate"}, "only extraction slots"),
        ({"allow_empty": True}, "only extraction slots"),
        ({"template": 'A: "{*}"', "options": [], "allow_empty": True}, "allow_empty: only mode 'generate'"),
        ({"template": "Summary:{*}", "options": [], "mode": "generate", "allow_empty": "maybe"}, "allow_empty"),
        ({"template": "Q {x}{?}", "values": {"x": []}}, "at least one value"),
        ({"answer_in": "robot"}, "answer_in"),
    ],
)
def test_bad_queries_are_rejected_with_a_reason(query, field_fragment):
    with pytest.raises(ValidationError) as error:
        ScoringRequest.model_validate(request(**query))
    assert field_fragment in str(error.value)


def test_duplicate_query_ids_rejected():
    body = request()
    body["scoring"]["queries"].append(dict(body["scoring"]["queries"][0]))
    with pytest.raises(ValidationError, match="duplicate query id"):
        ScoringRequest.model_validate(body)


def test_unknown_fields_rejected():
    body = request()
    body["scoring"]["queries"][0]["optionz"] = []
    with pytest.raises(ValidationError, match="optionz"):
        ScoringRequest.model_validate(body)


@pytest.mark.parametrize(
    "query, max_tokens",
    [
        ({"template": 'A: "{*}"'}, 16),
        ({"template": "Amount:{n}", "max_tokens": 8, "beam_width": 3}, 8),
        ({"template": "Total:{$} (incl. VAT)"}, 16),
        ({"template": "Summary:{*}", "mode": "generate"}, 64),
        ({"template": "Summary: {*}\n", "mode": "generate", "seed": 7, "temperature": 0.7, "max_tokens": 5}, 5),
        ({"template": "Summary:{*}", "mode": "generate", "allow_empty": True}, 64),
    ],
)
def test_extraction_slots_parse(query, max_tokens):
    parsed = ScoringRequest.model_validate(request(options=[], **query)).scoring.queries[0]
    assert parsed.num_max_tokens == max_tokens
    assert parsed.slot in ("*", "n", "$")


def test_slot_and_option_results_share_one_shape():
    from contract.scoring_results import Combination, OptionScore, SlotAnswer

    option = Combination(values={}, options=[OptionScore(text=" yes", logprob=-0.1, p=0.9, floor_p=0.5)],
                         residual=0.1)
    slot = Combination(values={}, answers=[SlotAnswer(text="$12.50", value={"amount": 12.5, "currency": "USD"},
                                                      p=0.8)], residual=0.2)
    assert option.answers is None and option.model_dump()["options"][0]["text"] == " yes"
    dumped = slot.model_dump()
    assert dumped["options"] == [] and dumped["answers"][0]["value"] == {"amount": 12.5, "currency": "USD"}
    assert Combination.model_validate_json(slot.model_dump_json()) == slot


def test_a_validated_query_carries_its_template_parsed_once(monkeypatch):
    """The validator parses the template and the query keeps it: reading it later, through
    a JSON round trip of the request, or a copy of it parses nothing again."""
    import contract.protocol as protocol_module
    from contract.templates import Placeholder, parse_template

    calls = []
    monkeypatch.setattr(protocol_module, "parse_template", lambda text: calls.append(text) or parse_template(text))
    body = {"messages": [{"role": "user", "content": "x"}],
            "scoring": {"queries": [{"id": "b", "template": "\n\nDoes it mention {brand}?{?}",
                                     "options": [" yes", " no"], "values": {"brand": ["Acme", "Zeta"]}},
                                    {"id": "n", "template": "\n\nHow many: {n} items", "max_tokens": 4}]}}
    request = ScoringRequest.model_validate(body)
    assert len(calls) == 2
    option, number = request.scoring.queries
    assert option.parsed_template.pieces == ("\n\nDoes it mention ", Placeholder("brand"), "?")
    assert option.parsed_template.fill({"brand": "Acme"}) == "\n\nDoes it mention Acme?"
    assert (number.slot, number.parsed_template.tail) == ("n", " items")
    copied = ScoringRequest.model_validate_json(request.model_dump_json(exclude_unset=True)).model_copy(update={"model": "m"})
    assert len(calls) == 4  # the round trip validates (and parses) once more; the copy does not
    assert [q.parsed_template for q in copied.scoring.queries] == [option.parsed_template, number.parsed_template]
    assert [q.slot for q in request.scoring.queries] == ["?", "n"] and len(calls) == 4


def _placeholders(num: int, per: int = 1, value: str = "v") -> dict:
    names = [f"p{i}" for i in range(num)]
    return {"template": "".join(f"{{{name}}} " for name in names) + "?{?}",
            "values": {name: [f"{value}{j}" for j in range(per)] for name in names}}


@pytest.mark.parametrize("at_limit, past_it, message", [
    (_placeholders(16), _placeholders(17), "at most 16"),  # placeholders of one template
    (_placeholders(1, value="v" * 4_095), _placeholders(1, value="v" * 4_096), "at most 4096"),  # one value
    (_placeholders(2, per=64), {"template": "{a} {b}?{?}", "values": {"a": list(map(str, range(64))),
                                                                      "b": list(map(str, range(65)))}},
     "4160 combinations, more than 4096"),  # one query's grid
])
def test_per_query_limits_admit_their_default_and_refuse_one_more(at_limit, past_it, message):
    ScoringRequest.model_validate(request(**at_limit))
    with pytest.raises(ValidationError, match=message):
        ScoringRequest.model_validate(request(**past_it))


@pytest.mark.parametrize("calibrate", [None, "contextual"])
def test_a_requests_templates_are_parsed_once_each(monkeypatch, calibrate):
    """Each query's template is parsed once, though the spec's `calibrate` looks at every query and
    every model around a Query checks it again; a copy with a new template parses the new one."""
    import contract.protocol as protocol

    parsed = []
    monkeypatch.setattr(protocol, "parse_template", lambda text: parsed.append(text) or parse_template(text))
    queries = [{"id": "a", "template": "\n\nRefund?{?}", "options": [" yes", " no"]},
               {"id": "b", "template": '\n\nName: "{*}"'}]
    scoring = {"queries": queries} | ({"calibrate": calibrate} if calibrate else {})
    request = ScoringRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "scoring": scoring})
    ScoringRequest(messages=request.messages, scoring=request.scoring)  # validated again around the same queries
    assert sorted(parsed) == sorted(q["template"] for q in queries)
    assert [q.calibrate for q in request.scoring.queries] == [calibrate, None]
    copy = request.scoring.queries[0].model_copy(update={"template": "\n\nRefund now?{?}"})
    ScoringSpec(queries=[copy])
    assert parsed[-1] == "\n\nRefund now?{?}" and copy.parsed_template.slot == "?"
