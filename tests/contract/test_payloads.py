"""Job payloads share one JobSpec whose fields sit flat on the wire; a payload built from
another's spec sends only what its producer set."""

from contract.payloads import ChunkPayload, JobCreate, JobItem, JobSpec, PlanPayload
from contract.protocol import PackRef, ScoringSpec

SPEC = ScoringSpec.model_validate({"queries": [{"id": "q", "template": "Yes or no?{?}", "options": [" yes", " no"]}]})
SPEC_FIELDS = {"model", "scoring", "packs", "debug"}


def test_the_spec_fields_sit_flat_in_every_payload():
    body = JobCreate.model_validate({"scoring": SPEC.model_dump(exclude_unset=True), "packs": [{"id": "spinf/moderation"}],
                                     "items": [{"custom_id": "a", "text": "hi"}]})
    chunk = ChunkPayload(job_id="j", chunk_index=0, model="m", scoring=SPEC, items=body.items, num_rows=1)
    plan = PlanPayload(job_id="j", model="m", scoring=SPEC, input="s3://b/in/", output="s3://b/out/",
                       chunk_num_rows=8)
    for payload in (body, chunk, plan):
        assert isinstance(payload, JobSpec)
        assert SPEC_FIELDS <= set(payload.model_dump(mode="json"))
    assert (body.model, body.packs, body.debug) == (None, [PackRef(id="spinf/moderation")], False)
    assert set(chunk.model_dump(mode="json")) == SPEC_FIELDS | {"job_id", "chunk_index", "items", "source", "requests", "output",
                                                                "num_rows", "access"}
    assert set(plan.model_dump(mode="json")) == SPEC_FIELDS | {"job_id", "input", "output", "chunk_num_rows",
                                                               "access"}


def test_a_chunk_built_from_a_plans_spec_sends_only_what_the_plan_was_given():
    def chunk_of(plan: PlanPayload) -> dict:
        item = JobItem(custom_id="a", text="hi")
        payload = ChunkPayload(job_id="j", chunk_index=0, **plan.spec_fields(), items=[item], num_rows=1)
        return payload.model_dump(mode="json", exclude_unset=True)

    bare = PlanPayload(job_id="j", model="m", scoring=SPEC, input="s3://b/in/", output="s3://b/out/", chunk_num_rows=8)
    assert set(chunk_of(bare)) == {"job_id", "chunk_index", "model", "scoring", "items", "num_rows"}
    given = PlanPayload.model_validate(bare.model_dump(exclude_unset=True) | {"debug": True, "packs": [{"id": "p/x"}]})
    sent = chunk_of(given)
    assert (sent["debug"], sent["packs"]) == (True, [{"id": "p/x"}])
    request = ChunkPayload.model_validate(sent).request_for(JobItem(custom_id="a", text="hi"))
    assert (request.debug, [ref.id for ref in request.packs], request.scoring) == (True, ["p/x"], SPEC)
