"""Requests that arrive during a batch (Engine.score_batch's `arrivals`) and the warm-up passes."""

from functools import partial

from engine.checks.parity import load_cases
from engine.pipeline.packer import pack_trees
from engine.pipeline.warm_up import warm_up_batches


def _bodies(output):
    return [r.model_dump(exclude={"usage"}) for r in output.results]


def test_arrivals_ride_the_next_pass_and_score_as_alone(tiny_engine):
    """Requests handed in mid-batch are packed before the rest, get the indices after the
    batch's own, and score bit for bit as they do alone."""
    engine = tiny_engine("qwen2", max_num_batched_tokens=512)
    cases = load_cases(has_chat_template=True)
    batch, late = cases[:10], cases[10:13]
    alone = engine.score_requests(late)
    compiled = [engine.compile(r) for r in batch]
    handed = []
    calls = [0]

    def arrivals():
        calls[0] += 1
        if calls[0] == 3:  # while the batch's third request is about to be packed
            handed.extend(engine.compile(r) for r in late)
            return list(handed)
        return []

    seen, told = {}, {}
    output = engine.score_batch(compiled, arrivals=arrivals,
                                on_result=lambda i, r, ids: (seen.setdefault(i, ids), told.setdefault(i, r)))
    assert len(output.results) == len(batch) + len(late)
    assert output.results == [None] * len(output.results), "a response told through on_result was kept"
    bodies = [told[i].model_dump(exclude={"usage"}) for i in range(len(batch) + len(late))]
    assert bodies[len(batch):] == _bodies(alone)
    assert bodies[: len(batch)] == _bodies(engine.score_requests(batch))
    late_passes = [min(output.pass_ids[len(batch) + i]) for i in range(len(late))]
    later_batch_rows = [min(output.pass_ids[i]) for i in range(3, len(batch))]
    assert max(late_passes) <= min(later_batch_rows), "arrivals were packed behind rows that came before them"
    assert set(seen) >= {len(batch) + i for i in range(len(late))}, "on_result did not name the arrivals"


def test_arrivals_need_their_own_floors(tiny_engine):
    """An arrival whose floors nobody in the batch read (none cached either) gets them read in
    the stream: the same response as scored alone on a fresh engine."""
    engine = tiny_engine("qwen2", max_num_batched_tokens=640)  # its own engine: an empty floor cache
    cases = load_cases(has_chat_template=True)
    first = cases[:2]
    late = [_reworded(c, f" (version {i})") for i, c in enumerate(cases[2:4])]
    assert not _floor_keys(engine, *late) & _floor_keys(engine, *first)
    assert all(engine.floors.get(k) is None for c in late for k in _floor_keys(engine, c))
    given = [False]

    def arrivals():
        if given[0]:
            return []
        given[0] = True
        return [engine.compile(r) for r in late]

    output = engine.score_batch([engine.compile(r) for r in first], arrivals=arrivals)
    fresh = tiny_engine("qwen2", max_num_batched_tokens=768)
    assert _bodies(output)[2:] == _bodies(fresh.score_requests(late))
    assert sum(output.results[2 + i].usage.floors_computed for i in range(len(late))) > 0


def _reworded(request, suffix: str):
    """The request with every question template changed: floors of its own."""
    body = request.model_dump(mode="json", exclude_defaults=True)
    for query in body["scoring"]["queries"]:
        query["template"] = suffix + query["template"]
    return type(request).model_validate(body)


def _floor_keys(engine, *requests):
    return {key for r in requests for key in engine.compile(r).floor_keys}


def test_warm_up_batches_cover_every_bucket(tiny_engine):
    """One batch per padded size up to the budget, each filling exactly that bucket, and each
    runs through the model."""
    engine = tiny_engine("qwen2", max_num_batched_tokens=1024)
    pack = partial(pack_trees, mask_fn=engine.mask_fn, dense_masks=engine.dense_masks)
    bucket = 256
    batches = list(warm_up_batches(pack, 1024, bucket, engine.max_context_tokens))
    sizes = [-(-len(b.input_ids) // bucket) * bucket for b in batches]
    assert sizes == [256, 512, 768, 1024]
    for batch in batches:
        engine.runner.run(batch)
    assert engine.warm_up() == 0  # CPU: nothing compiles
