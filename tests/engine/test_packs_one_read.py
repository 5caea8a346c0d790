"""A request naming a pack plus its own queries is served from one read of its content."""

from __future__ import annotations

from spinf_jobs.packs import PackRegistry, expand_pack, split_pack_results, with_packs
from spinf_jobs.protocol import ScoringRequest

REQUEST = {
    "messages": [{"role": "user", "content": "Customer support message:\nI was charged twice for September."}],
    "scoring": {"queries": [{"id": "refund", "template": "\n\nRefund?{?}", "options": [" yes", " no"]}]},
}


def test_pack_and_own_queries_share_one_read_of_the_content(tiny_engine):
    engine = tiny_engine("qwen2")
    pack = PackRegistry.load().get("spinf/support-triage")
    alone = engine.score(ScoringRequest.model_validate(REQUEST))
    merged_request = with_packs(ScoringRequest.model_validate(REQUEST), [pack])
    batch = engine.score_batch([merged_request])
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
    assert own[0].combinations[0].options == alone.results[0].combinations[0].options  # same answer
    assert len(merged.results) == 1 + len(expand_pack(pack))
    assert set(applied[0]["categories"]) == {"billing", "technical", "account", "shipping", "cancellation"}
    assert applied[0]["decisions"]["queue"] in applied[0]["categories"]


def _num_read(response) -> int:
    usage = response.usage
    return usage.content_tokens + usage.question_tokens + usage.option_tokens
