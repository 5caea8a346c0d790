"""A batch fed while it runs (Engine.score_batch's `refill`): the passes go on, the scores are
the requests' alone, responses told through `on_result` are let go, errors are told at once."""

from engine.checks.parity import load_cases
from engine.pipeline.stages import RequestError
from contract.protocol import ScoringRequest


def _body(response):
    return response.model_dump(exclude={"usage"})


def _feeder(engine, groups):
    """refill() handing in each group in turn, then nothing; the calls it got."""
    calls = []

    def refill():
        calls.append(len(calls))
        return [engine.compile(r) for r in groups[len(calls) - 1]] if len(calls) <= len(groups) else []

    return refill, calls


def test_refill_goes_on_in_one_call_and_scores_as_alone(tiny_engine):
    engine = tiny_engine("qwen2", max_num_batched_tokens=512)
    cases = load_cases(has_chat_template=True)
    first, more, last = cases[:3], cases[3:8], cases[8:10]
    refill, calls = _feeder(engine, [more, last])
    told = {}
    output = engine.score_batch([engine.compile(r) for r in first], refill=refill,
                                on_result=lambda i, r, ids: told.setdefault(i, (r, ids)))
    everything = first + more + last
    assert len(calls) == 3, "refill is asked once each time the batch runs out, until it brings nothing"
    assert sorted(told) == list(range(len(everything)))
    alone = engine.score_requests(everything).results
    assert [_body(told[i][0]) for i in range(len(everything))] == [_body(r) for r in alone]
    first_pass_of = [min(told[i][1]) for i in range(len(everything))]
    assert first_pass_of == sorted(first_pass_of), "a refilled request was packed ahead of one before it"
    assert max(told[len(first) - 1][1]) <= min(told[len(first)][1]) + 1, "a break between the refills"


def test_without_refill_or_listener_every_result_stays_in_the_output(tiny_engine):
    engine = tiny_engine("qwen2", max_num_batched_tokens=512)
    cases = load_cases(has_chat_template=True)[:4]
    output = engine.score_batch([engine.compile(r) for r in cases])
    assert all(r is not None for r in output.results)
    assert [_body(r) for r in output.results] == [_body(r) for r in engine.score_requests(cases).results]


def test_a_request_error_is_told_before_any_pass(tiny_engine):
    engine = tiny_engine("qwen2", max_num_batched_tokens=512)
    [case] = load_cases(has_chat_template=True)[:1]
    error = RequestError("messages", "nothing to score")
    order = []
    output = engine.score_batch([engine.compile(case), error],
                                on_result=lambda i, r, ids: order.append((i, r if i == 1 else None, ids)))
    assert order[0] == (1, error, ()), "the error was not told first, with no pass"
    assert [i for i, _, _ in order] == [1, 0]
    assert output.results[1] is error and output.results[0] is None


def test_no_refill_once_a_request_with_slots_is_in(tiny_engine):
    """Slots are decoded after the batch's last pass: a batch holding one must end."""
    engine = tiny_engine("qwen2", max_num_batched_tokens=512)
    cases = load_cases(has_chat_template=True)
    slot = ScoringRequest.model_validate({
        "messages": [{"role": "user", "content": "My order 1234 arrived broken."}],
        "scoring": {"queries": [{"id": "order", "template": "\n\nOrder number: \"{*}\"", "max_tokens": 3}]}})
    refill, calls = _feeder(engine, [cases[:2]])
    output = engine.score_batch([engine.compile(cases[2]), engine.compile(slot)], refill=refill)
    assert calls == [] and len(output.results) == 2
    assert output.results[1].results[0].combinations[0].answers is not None
