"""The engine end to end on tiny random checkpoints of every family (CPU, fp32)."""

import pytest

from contract.protocol import ScoringRequest
from engine import RequestError
from engine.checks.parity import load_cases, run_parity, summarize

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3_text")

TOLERANCE = 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_with_transformers(family, tiny_checkpoint):
    rows = run_parity(str(tiny_checkpoint(family)))
    max_logprob, worst = summarize(rows)
    assert len(rows) >= 20 * 5
    assert worst <= TOLERANCE, f"{family}: max diff {worst} (logprob {max_logprob})"


def test_parity_negative_control_fails(tiny_checkpoint):
    rows = run_parity(str(tiny_checkpoint("qwen2")), num_contents=4, leak_sibling=True)
    max_logprob, _ = summarize(rows)
    assert max_logprob > TOLERANCE, "a mask leaking sibling branches went unnoticed"


def _strip_usage(response):
    body = response.model_dump()
    body.pop("usage")
    return body


def test_batch_invariance_alone_vs_packed(tiny_engine):
    engine = tiny_engine("qwen2", max_num_batched_tokens=1 << 16)
    requests = load_cases(has_chat_template=True)
    others = [r.model_copy(update={"messages": [r.messages[0].model_copy(update={"content": f"{i}: {r.messages[0].content}"})]})
              for i in range(3) for r in requests]
    target = requests[5]
    alone = engine.score_requests([target])
    packed_requests = list(reversed(others[:30])) + [target] + others[30:]
    assert len(packed_requests) >= 51
    packed = engine.score_requests(packed_requests)
    index = packed_requests.index(target)
    target_passes = set(packed.pass_ids[index])
    neighbours = [i for i, ids in enumerate(packed.pass_ids) if i != index and target_passes & set(ids)]
    assert len(neighbours) >= 50, f"only {len(neighbours)} contents shared a pass with the target"
    assert _strip_usage(alone.results[0]) == _strip_usage(packed.results[index])


def test_small_first_pass_and_early_responses_change_nothing(tiny_engine, monkeypatch):
    """A capped first pass (what CUDA engines do) and responses built pass by pass (while the
    next pass runs) give the same responses as one big pass."""
    from engine.pipeline.responses import ResponseBuilder

    requests = load_cases(has_chat_template=True)[:12]
    reference = tiny_engine("qwen2", max_num_batched_tokens=1 << 16).score_requests(requests)
    engine = tiny_engine("qwen2", max_num_batched_tokens=1024)
    engine.first_pass_tokens = 256
    built_before = []  # responses already built when each pass's scores arrive
    collect = ResponseBuilder.collect
    monkeypatch.setattr(ResponseBuilder, "collect", lambda self, *a: built_before.append(len(self._done)) or collect(self, *a))
    split = engine.score_requests(requests)
    passes = sorted({i for ids in split.pass_ids for i in ids})
    assert len(passes) >= 3
    assert 1 <= sum(passes[0] in ids for ids in split.pass_ids) < 4, "the first pass was not capped"
    done_before_last = sum(max(ids) < passes[-1] for ids in split.pass_ids)
    assert built_before[-1] == done_before_last > 0
    for a, b in zip(reference.results, split.results, strict=True):
        assert _strip_usage(a) == _strip_usage(b)


def test_tree_larger_than_budget_is_split_not_refused(tiny_checkpoint):
    from engine.engine import Engine, EngineConfig

    folder = str(tiny_checkpoint("llama"))
    request = load_cases(has_chat_template=True)[2]
    whole = Engine(EngineConfig(model=folder, device="cpu", dtype="float32")).score_requests([request])
    small = Engine(EngineConfig(model=folder, device="cpu", dtype="float32", max_num_batched_tokens=128))
    split = small.score_requests([request])
    assert len(split.pass_ids[0]) > 1, "the tree was not split across passes"
    for a, b in zip(whole.results[0].results, split.results[0].results):
        for ca, cb in zip(a.combinations, b.combinations):
            for oa, ob in zip(ca.options, cb.options):
                # float32 rounding only: attention reads another key layout once split
                assert abs(oa.logprob - ob.logprob) <= 1e-6 * max(1.0, abs(oa.logprob))
                assert abs(oa.p - ob.p) < 1e-5 and oa.floor_p == ob.floor_p


def test_floors_are_cached_across_requests(tiny_engine):
    engine = tiny_engine("qwen3", floor_cache_size=1000)
    first, second = load_cases(has_chat_template=True)[:2]
    a = engine.score_requests([first]).results[0]
    b = engine.score_requests([second]).results[0]
    assert a.usage.floors_computed > 0 and a.usage.floor_tokens > 0
    assert b.usage.floors_computed == 0 and b.usage.floor_tokens == 0
    assert b.usage.floors_cached == a.usage.floors_computed
    assert [o.floor_p for r in a.results for c in r.combinations for o in c.options] == [
        o.floor_p for r in b.results for c in r.combinations for o in c.options
    ]


def _one(content="hi", model=None, **query):
    base = {"id": "q", "template": "\n\nAnswer:{?}", "options": [" yes", " no"]}
    base.update(query)
    body = {"messages": [{"role": "user", "content": content}], "scoring": {"queries": [base]}}
    if model:
        body["model"] = model
    return ScoringRequest.model_validate(body)


def test_bad_requests_become_errors_not_failures(tiny_engine):
    engine = tiny_engine("gemma3_text")
    good = _one()
    output = engine.score_requests([
        _one(model="no-such-model"),
        _one(answer_in="assistant"),
        _one(content="word " * (engine.max_context_tokens + 10)),
        good,
    ])
    unknown, assistant, too_long, ok = output.results
    assert isinstance(unknown, RequestError) and unknown.field == "model"
    assert isinstance(assistant, RequestError) and "chat template" in assistant.message
    assert isinstance(too_long, RequestError) and too_long.field == "messages"
    assert not isinstance(ok, RequestError) and abs(sum(o.p for o in ok.results[0].combinations[0].options) - 1) < 1e-9


def test_numbers_are_consistent(tiny_engine):
    import math

    response = tiny_engine("llama").score(load_cases(has_chat_template=True)[0])
    for result in response.results:
        for combination in result.combinations:
            logprobs = [o.logprob for o in combination.options]
            total = sum(math.exp(lp) for lp in logprobs)
            assert all(lp <= 0 for lp in logprobs)
            for option in combination.options:
                assert option.p == pytest.approx(math.exp(option.logprob) / total, rel=1e-9)
            assert combination.residual == pytest.approx(max(0.0, 1 - total), abs=1e-12)
            assert sum(o.floor_p for o in combination.options) == pytest.approx(1.0)


def test_debug_shows_rendered_prompt_and_scored_tokens(tiny_engine):
    engine = tiny_engine("qwen2")
    request = _one(content="Refund me", template="\n\nAnswer:{?}").model_copy(update={"debug": True})
    [combination] = engine.score(request).results[0].combinations
    assert combination.debug.rendered.endswith("Refund me\n\nAnswer:")
    for option in combination.debug.options:
        full = engine.tokenizer(combination.debug.rendered + option.text, add_special_tokens=False)["input_ids"]
        assert full[combination.debug.branch_point :] == option.token_ids


def _collections_inside_batch(engine, requests, monkeypatch) -> int:
    """How many cyclic collections start while the batch's work runs (gen-0 threshold lowered
    so an unguarded batch would trigger many)."""
    import gc

    state = {"inside": False, "count": 0}
    score = engine._score_batch

    def marked(batch, *rest):
        state["inside"] = True
        try:
            return score(batch, *rest)
        finally:
            state["inside"] = False

    def on_collection(phase, info):
        state["count"] += phase == "start" and state["inside"]

    monkeypatch.setattr(engine, "_score_batch", marked)
    threshold = gc.get_threshold()
    gc.callbacks.append(on_collection)
    gc.set_threshold(50, 10**6, 10**6)  # young collections only, often
    try:
        engine.score_requests(requests)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(on_collection)
    return state["count"]


def test_no_cyclic_collection_inside_a_batch(tiny_engine, monkeypatch):
    import contextlib
    import gc

    import engine.engine as engine_module

    engine = tiny_engine("qwen2")
    requests = load_cases(has_chat_template=True)[:4]
    assert gc.isenabled()
    assert _collections_inside_batch(engine, requests, monkeypatch) == 0
    assert gc.isenabled()  # restored after the batch
    monkeypatch.setattr(engine_module, "cyclic_gc_deferred", contextlib.nullcontext)  # the control
    assert _collections_inside_batch(engine, requests, monkeypatch) > 10


def test_collector_restored_when_a_batch_raises(tiny_engine, monkeypatch):
    import gc

    engine = tiny_engine("qwen2")

    def broken(requests, *rest):
        assert not gc.isenabled()
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "_score_batch", broken)
    with pytest.raises(RuntimeError, match="boom"):
        engine.score_batch([])
    assert gc.isenabled()


def test_compiled_requests_are_packed_from_the_tree_compile_built(tiny_engine, monkeypatch):
    """A worker compiles each request (its tokens counted), then scores the compiled batch: the
    tree is built once, and the scores are those of scoring the requests as they are."""
    import engine.engine as engine_module
    import engine.pipeline.compiler as compiler_module
    import engine.pipeline.packer as packer_module

    engine = tiny_engine("qwen2")
    requests = load_cases(has_chat_template=True)[:3]
    expected = [_strip_usage(r) for r in engine.score_requests(requests).results]
    builds = []

    def counting(build):
        def build_tree(branches):
            builds.append(len(branches))
            return build(branches)
        return build_tree

    monkeypatch.setattr(engine_module, "build_tree", counting(engine_module.build_tree))
    monkeypatch.setattr(compiler_module, "build_tree", counting(compiler_module.build_tree))
    monkeypatch.setattr(packer_module, "build_tree", counting(packer_module.build_tree))
    compiled = [engine.compile(r) for r in requests]
    counts = [c.num_tokens for c in compiled]
    assert len(builds) == 3 and all(counts)
    got = engine.score_batch(compiled)
    assert len(builds) == 3  # none more: the floors are cached (the first call), the trees counted
    assert [_strip_usage(r) for r in got.results] == expected


def test_host_work_runs_while_a_pass_is_in_flight_and_changes_nothing(tiny_engine, passes_in_flight):
    engine = tiny_engine("qwen2", max_num_batched_tokens=1024)  # several passes
    requests = load_cases(has_chat_template=True)[:6]
    expected = [_strip_usage(r) for r in engine.score_requests(requests).results]
    passes_in_flight(busy=3)
    calls = []
    got = engine.score_requests(requests, while_waiting=lambda: calls.append(1) or True)
    assert [_strip_usage(r) for r in got.results] == expected
    num_passes = len({p for ids in got.pass_ids for p in ids})
    assert num_passes >= 2 and len(calls) == 3 * num_passes  # until each pass is done
    calls.clear()
    engine.score_requests(requests, while_waiting=lambda: calls.append(1) or False)
    assert len(calls) == num_passes  # a step that says "no more" is not run again in that wait


def test_a_floor_content_past_the_context_is_an_error_not_scored(tiny_engine):
    from contract.protocol import Message

    engine = tiny_engine("llama")
    query = {"id": "q", "template": "\n\nYes or no?{?}", "options": [" yes", " no"]}
    long_floor = "word " * (engine.max_context_tokens + 10)  # more tokens than the model reads
    framed = ScoringRequest(messages=[Message(role="user", content="hi", floor_content=long_floor)],
                            scoring={"queries": [query]})
    short_floor = ScoringRequest(messages=[Message(role="user", content="hi", floor_content="Message:\n")],
                                 scoring={"queries": [query]})
    refused, scored = engine.score_requests([framed, short_floor]).results
    assert isinstance(refused, RequestError) and refused.field == "messages.floor_content"
    assert str(engine.max_context_tokens) in refused.message
    assert not isinstance(scored, RequestError)
