"""Prometheus metrics: per-app registry, HTTP latency here, queue and pass numbers from Redis.

    API process: spinf_http_request_seconds{route,method,status}, spinf_score_wait_seconds
    scrape time: spinf_queue_depth{queue}, spinf_queued_rows, spinf_workers (Redis state)
                 spinf_rows_total, spinf_rows_failed_total, spinf_passes_total,
                 spinf_pass_tokens_total, spinf_pass_budget_tokens_total (worker counters in
                 Redis; rows/s = rate(spinf_rows_total), pass fill = rate(tokens)/rate(budget))
                 per live worker {worker, model, device}: spinf_worker_rows_per_second,
                 spinf_worker_pass_fill (the worker's own last-minute rates, docs/deploy.md),
                 spinf_worker_heartbeat_age_seconds; spinf_model_live_workers{model}
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from redis import Redis

from api.served import live_workers
from contract import queues
from contract.settings import Settings

_COUNTERS = {
    "rows_total": "Rows scored or settled with an error by the workers",
    "rows_failed_total": "Rows that got an error row",
    "passes_total": "Forward passes run",
    "pass_tokens_total": "Tokens packed into passes",
    "pass_budget_tokens_total": "Token budget of the passes run (fill = tokens / budget)",
}
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(slots=True)
class Metrics:
    registry: CollectorRegistry
    http_latency: Histogram
    score_wait: Histogram


class RedisCollector:
    def __init__(self, r: Redis, settings: Settings) -> None:
        self.r = r
        self.settings = settings

    def collect(self):
        depth = GaugeMetricFamily("spinf_queue_depth", "RQ jobs waiting per queue", labels=["queue"])
        for key in sorted(self.r.scan_iter(match=f"rq:queue:{queues.PREFIX}:*", count=500)):
            name = key.decode()
            if name.count(":") == 4:  # rq:queue:spinf:<model>:<sync|batch>
                depth.add_metric([name.removeprefix("rq:queue:")], self.r.llen(name))
        yield depth
        yield GaugeMetricFamily("spinf_queued_rows", "Rows queued and not settled (429 gauge)",
                                value=int(self.r.get(queues.QUEUED_ROWS_KEY) or 0))
        workers = live_workers(self.r, self.settings)
        yield GaugeMetricFamily("spinf_workers", "Live workers", value=len(workers))
        yield from _worker_gauges(workers, self.settings)
        stats = {k.decode(): int(v) for k, v in self.r.hgetall(queues.STATS_KEY).items()}
        for name, help_text in _COUNTERS.items():
            yield CounterMetricFamily(f"spinf_{name.removesuffix('_total')}", help_text, value=stats.get(name, 0))


def _worker_gauges(workers: list[dict], settings: Settings):
    labels = ["worker", "model", "device"]
    rate = GaugeMetricFamily("spinf_worker_rows_per_second", "Rows a worker settled per second, last minute", labels=labels)
    fill = GaugeMetricFamily("spinf_worker_pass_fill", "Tokens packed / pass budget of a worker's passes, last minute",
                             labels=labels)
    age = GaugeMetricFamily("spinf_worker_heartbeat_age_seconds", "Seconds since the worker last checked in",
                            labels=labels)
    live = GaugeMetricFamily("spinf_model_live_workers", "Live workers serving a model (0: /health is 503)",
                             labels=["model"])
    per_model = dict.fromkeys([settings.default_model, *settings.models, *settings.scale_to_zero_models], 0)
    for worker in workers:
        for model in worker["models"]:
            values = [worker["name"], model["id"], worker.get("device", "unknown")]
            rate.add_metric(values, worker.get("rows_per_s", 0.0))
            if worker.get("pass_fill") is not None:
                fill.add_metric(values, worker["pass_fill"])
            age.add_metric(values, worker["heartbeat_age_s"])
            per_model[model["id"]] = per_model.get(model["id"], 0) + 1
    for model, count in per_model.items():
        live.add_metric([model], count)
    yield from (rate, fill, age, live)


def make_metrics(r: Redis, settings: Settings) -> Metrics:
    registry = CollectorRegistry()
    registry.register(RedisCollector(r, settings))
    http_latency = Histogram("spinf_http_request_seconds", "HTTP request latency", ["route", "method", "status"],
                             registry=registry, buckets=_LATENCY_BUCKETS)
    score_wait = Histogram("spinf_score_wait_seconds", "Queue + scoring time of /v1/score and chat calls",
                           registry=registry, buckets=_LATENCY_BUCKETS)
    return Metrics(registry, http_latency, score_wait)
