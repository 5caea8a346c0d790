"""The sync lane (engine/pipeline/sync_lane.py): arrivals in passes of their own beside the
batch's, yielded as they end, scoring the bits they get alone."""

from __future__ import annotations

from dataclasses import dataclass

from contract.protocol import ScoringRequest
from engine.checks.parity import load_cases
from engine.pipeline.sync_lane import SyncLane


def _bodies(results):
    return [r.model_dump(exclude={"usage"}) for r in results]


def _handing(engine, groups: dict[int, list]):
    """arrivals() that hands `groups[k]` (compiled) at its first look once the engine has run k
    passes; the looks are counted."""
    looks = [0]
    pending = dict(groups)

    def arrivals():
        looks[0] += 1
        due = [k for k in pending if engine.runner.num_passes >= k]
        return [engine.compile(r) for k in sorted(due) for r in pending.pop(k)]

    return arrivals, looks


def test_arrivals_run_in_passes_of_their_own_and_score_as_alone(tiny_engine):
    engine = tiny_engine("qwen2", max_num_batched_tokens=640, sync_lane=True)  # the lane's share: 160 tokens
    cases = load_cases(has_chat_template=True)
    batch, late, later = cases[:10] * 2, cases[10:12], cases[12:14]
    arrivals, looks = _handing(engine, {engine.runner.num_passes + 2: late, engine.runner.num_passes + 4: later})
    told = {}
    output = engine.score_batch([engine.compile(r) for r in batch], arrivals=arrivals,
                                on_result=lambda i, r, ids: told.setdefault(i, (r, ids)))
    assert looks[0] >= 3, "the lane looked for arrivals fewer times than the batch has passes"
    arrived = range(len(batch), len(batch) + len(late) + len(later))
    assert len(output.results) == len(batch) + len(late) + len(later)
    assert _bodies(told[i][0] for i in arrived) == _bodies(engine.score_requests(late + later).results)
    assert _bodies(told[i][0] for i in range(len(batch))) == _bodies(engine.score_requests(batch).results)
    batch_passes = {p for i in range(len(batch)) for p in told[i][1]}
    lane_passes = {p for i in arrived for p in told[i][1]}
    assert lane_passes and not lane_passes & batch_passes, "an arrival shared a pass with the batch's rows"
    assert max(lane_passes) < max(batch_passes), "the arrivals waited for the batch to end"


def test_an_arrival_at_the_last_look_is_served_and_none_is_taken_after(tiny_engine):
    engine = tiny_engine("qwen2", max_num_batched_tokens=4096, sync_lane=True)  # the batch: one pass
    cases = load_cases(has_chat_template=True)
    arrivals, looks = _handing(engine, {0: [cases[3]]})
    output = engine.score_batch([engine.compile(r) for r in cases[:2]], arrivals=arrivals)
    assert _bodies(output.results[2:]) == _bodies(engine.score_requests([cases[3]]).results)
    assert len(output.results) == 3
    assert looks[0] == 1, "one look while the batch's one pass ran; none once the batch had ended"


def _long(case, words: int):
    """The case with its last message's content made `words` words longer."""
    body = case.model_dump(mode="json", exclude_defaults=True)
    body["messages"][-1]["content"] += " more" * words
    return type(case).model_validate(body)


def test_an_arrival_too_large_for_the_lane_joins_the_batch_passes(tiny_engine):
    engine = tiny_engine("qwen2", max_num_batched_tokens=1024, sync_lane=True)  # the lane's share: 256 tokens
    cases = load_cases(has_chat_template=True)
    large = _long(cases[12], 200)
    assert engine.compile(large).num_tokens > 1024 // 4
    batch = cases[:10] * 2
    arrivals, _ = _handing(engine, {engine.runner.num_passes + 1: [large, cases[13]]})
    told = {}
    engine.score_batch([engine.compile(r) for r in batch], arrivals=arrivals,
                       on_result=lambda i, r, ids: told.setdefault(i, (r, ids)))
    assert _bodies([told[20][0], told[21][0]]) == _bodies(engine.score_requests([large, cases[13]]).results)
    batch_passes = {p for i in range(len(batch)) for p in told[i][1]}
    assert set(told[20][1]) & batch_passes, "the large arrival did not ride a batch pass"
    assert not set(told[21][1]) & batch_passes, "the small one did not ride the lane"


def test_a_large_arrival_the_batch_ended_before_taking_is_served_after_it(tiny_engine):
    engine = tiny_engine("qwen2", max_num_batched_tokens=1024, sync_lane=True)
    cases = load_cases(has_chat_template=True)
    large = _long(cases[12], 200)
    arrivals, looks = _handing(engine, {0: [large]})  # at the first look: the batch's one pass runs
    output = engine.score_batch([engine.compile(r) for r in cases[:2]], arrivals=arrivals)
    assert looks[0] == 1 and len(output.results) == 3
    assert _bodies(output.results[2:]) == _bodies(engine.score_requests([large]).results)


def test_an_arrival_with_a_slot_or_an_error_rides_the_lane(tiny_engine):
    engine = tiny_engine("qwen2", max_num_batched_tokens=512, sync_lane=True)
    cases = load_cases(has_chat_template=True)
    slot = ScoringRequest.model_validate({
        "messages": [{"role": "user", "content": "My order 1234 arrived broken."}],
        "scoring": {"queries": [{"id": "order", "template": "\n\nOrder number: \"{*}\"", "max_tokens": 3}]}})
    too_long = ScoringRequest.model_validate({
        "messages": [{"role": "user", "content": "word " * 4000}],
        "scoring": {"queries": [{"id": "q", "template": "\n\nOk?{?}", "options": [" yes", " no"]}]}})
    arrivals, _ = _handing(engine, {0: [slot, too_long]})
    told = {}
    output = engine.score_batch([engine.compile(r) for r in cases[:4]], arrivals=arrivals,
                                on_result=lambda i, r, ids: told.setdefault(i, r))
    results = [told.get(i, output.results[i]) for i in range(len(output.results))]
    alone = engine.score_requests([slot, too_long]).results
    assert _bodies(results[4:5]) == _bodies(alone[:1]) and results[4].results[0].combinations[0].answers is not None
    assert results[5] == alone[1] and results[5].field == "messages", results[5]


@dataclass
class _Pass:
    """A stand-in for a launched pass: done when the test says so."""

    batch: str
    done: bool = False

    def is_done(self) -> bool:
        return self.done

    def wait(self):
        assert self.done, "read before it ended"
        return f"output of {self.batch}"


def test_lane_passes_are_yielded_while_the_batch_pass_still_runs(monkeypatch):
    import torch

    from engine.pipeline import sync_lane

    monkeypatch.setattr(sync_lane, "POLL_S", 0.0)  # a look at every step

    launched: list[_Pass] = []
    arrivals = [["sync-a"], [], ["sync-b"], []]
    main = _Pass("batch pass")

    def source():
        return arrivals.pop(0) if arrivals else []

    def launch(batch):
        launched.append(_Pass(batch))
        return launched[-1]

    steps = []

    def while_waiting():  # the batch's host work; the device ends passes as it runs
        steps.append(len(steps))
        if len(steps) == 2:
            launched[0].done = True
        if len(steps) == 6:
            launched[1].done = True
        if len(steps) == 8:
            main.done = True
        return True

    lane = SyncLane(source, launch, torch.device("cpu"))
    seen = []
    for batch, output in lane.serve_until(main.is_done, while_waiting):
        seen.append((batch, output, main.done))
    assert seen == [("sync-a", "output of sync-a", False), ("sync-b", "output of sync-b", False)]
    assert [p.batch for p in launched] == ["sync-a", "sync-b"]
    arrivals[:] = [["sync-c"]]
    assert list(lane.drain()) == [] and arrivals == [["sync-c"]], "the lane took arrivals after the batch ended"
