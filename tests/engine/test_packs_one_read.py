"""A request naming a pack plus its own queries is served from one read of its content;
its floors keep the pack's presentation; an unknown pack is an error naming it."""

from __future__ import annotations

from contract.protocol import ScoringRequest
from contract.scoring_results import PackResult
from engine import RequestError
from prompt_packs.apply import expand_pack, split_pack_results, with_packs
from prompt_packs.registry import PackRegistry

REQUEST = {
    "messages": [{"role": "user", "content": "Customer support message:\nI was charged twice for September."}],
    "scoring": {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]},
}


def test_pack_and_own_queries_share_one_read_of_the_content(tiny_engine):
    engine = tiny_engine("qwen2")
    pack = PackRegistry.load().get("spinf/support-triage")
    alone = engine.score(ScoringRequest.model_validate(REQUEST))
    merged_request = with_packs(ScoringRequest.model_validate(REQUEST), [pack])
    batch = engine.score_requests([merged_request])
    merged = batch.results[0]
    pack_only = engine.score(ScoringRequest.model_validate(
        {**REQUEST, "scoring": {"queries": [q.model_dump(exclude_unset=True) for q in expand_pack(pack)]}}))
    # read once: the merged tree holds the content's tokens once, so it is as large as the
    # two separate trees less one copy of their shared trunk (which holds the content)
    num_content = len(engine.tokenizer(REQUEST["messages"][0]["content"])["input_ids"])
    assert min(alone.usage.content_tokens, pack_only.usage.content_tokens) >= num_content
    assert _num_read(merged) == _num_read(alone) + _num_read(pack_only) - merged.usage.content_tokens
    assert len(batch.pass_ids[0]) == 1
    own, applied = split_pack_results(merged.results, [pack])
    assert [r.id for r in own] == ["refund"]
    own_options, alone_options = own[0].combinations[0].options, alone.results[0].combinations[0].options
    assert [(o.logprob, o.p) for o in own_options] == [(o.logprob, o.p) for o in alone_options]  # same answer
    # the named pack frames the message, so the request's floors keep "Customer support
    # message:\n" (own queries too): the same floor as the caller setting that frame
    framed = ScoringRequest.model_validate({**REQUEST, "messages": [{**REQUEST["messages"][0],
                                                                     "floor_content": pack.presentation.empty}]})
    assert own[0].combinations[0].options == engine.score(framed).results[0].combinations[0].options
    assert len(merged.results) == 1 + len(expand_pack(pack))
    assert set(applied[0]["categories"]) == {"billing", "technical", "account", "shipping", "cancellation"}
    assert applied[0]["decisions"]["queue"] in applied[0]["categories"]


def _num_read(response) -> int:
    usage = response.usage
    return usage.content_tokens + usage.question_tokens + usage.option_tokens


def test_request_naming_a_pack_gets_its_output_beside_its_own_results(tiny_engine):
    engine = tiny_engine("qwen2")
    pack = PackRegistry.load().get("spinf/support-triage")
    named = engine.score(ScoringRequest.model_validate({**REQUEST, "packs": [{"id": pack.id}]}))
    merged = engine.score(with_packs(ScoringRequest.model_validate(REQUEST), [pack]))
    own, applied = split_pack_results(merged.results, [pack])
    assert [r.id for r in named.results] == ["refund"]
    assert named.results == own
    assert named.packs == [PackResult.model_validate(a) for a in applied]
    assert named.usage == merged.usage  # one read: the same tree as the merged request's
    topic = named.packs[0].questions["topic"]
    assert topic.combined["top"] in topic.choices
    assert named.packs[0].decisions["queue"] in named.packs[0].categories


def test_pack_only_request_needs_no_queries_of_its_own(tiny_engine):
    engine = tiny_engine("qwen2")
    body = {"messages": REQUEST["messages"], "packs": [{"id": "spinf/support-triage"}]}
    response = engine.score(ScoringRequest.model_validate(body))
    assert response.results == []
    assert response.packs[0].pack == "spinf/support-triage"


def test_floors_keep_the_pack_presentation_and_empty_only_the_content(tiny_engine):
    engine = tiny_engine("qwen2")
    pack = PackRegistry.load().get("spinf/support-triage")
    request = ScoringRequest.model_validate({**REQUEST, "packs": [{"id": pack.id}]})
    compiled = engine.compile(request)
    frame = pack.presentation.empty
    assert frame and frame in REQUEST["messages"][0]["content"]
    for key in compiled.floor_keys:
        assert frame in key.empty_prefix
        assert "charged twice" not in key.empty_prefix
    bare = engine.compile(ScoringRequest.model_validate(REQUEST))  # no pack: the whole message goes
    assert all(frame not in key.empty_prefix for key in bare.floor_keys)
    # the same frame given by the caller renders the same floor prefix as the pack's
    framed = {**REQUEST["messages"][0], "floor_content": frame}
    by_caller = engine.compile(ScoringRequest.model_validate({**REQUEST, "messages": [framed]}))
    assert by_caller.floor_keys[0].empty_prefix == compiled.floor_keys[0].empty_prefix


def test_unknown_pack_is_an_error_naming_it_and_the_loaded_ones(tiny_engine):
    engine = tiny_engine("qwen2")
    body = {**REQUEST, "packs": [{"id": "spinf/support-triage"}, {"id": "spinf/no-such-pack"}]}
    [error] = engine.score_requests([ScoringRequest.model_validate(body)]).results
    assert isinstance(error, RequestError)
    assert error.field == "packs[1].id"
    assert "spinf/no-such-pack" in error.message
    assert all(pack_id in error.message for pack_id in engine.packs.ids())


def test_a_query_id_clashing_with_a_pack_question_is_an_error(tiny_engine):
    engine = tiny_engine("qwen2")
    clash = {"id": "spinf/support-triage:topic", "template": "\n\nTopic?{?}", "options": [" a", " b"]}
    body = {**REQUEST, "scoring": {"queries": [clash]}, "packs": [{"id": "spinf/support-triage"}]}
    [error] = engine.score_requests([ScoringRequest.model_validate(body)]).results
    assert isinstance(error, RequestError) and error.field == "scoring.queries"

