"""The client side of benchmarks/service_load.py: batch jobs and sync calls over HTTP, timed.

    python3 benchmarks/load_generator.py PLAN.json OUT.json
    PLAN {base_url, key, jobs: [{items, scoring}], sync: {texts, scoring, num_calls, rate_per_s}}
      --> every job at once (POST /v1/jobs), then sync calls at a fixed rate (POST /v1/score,
          each its own task, so a slow one never holds the next back) until num_calls are sent
          and every job has ended (GET /v1/jobs/{id} every POLL_S)
      --> OUT {started, jobs: [{id, submitted, ended, status, done, failed}],
               sync: [{index, sent, received, status, job_id}]}

Times are `time.time()`: the worker process of the same host reads the same clock. Sync call
i's message starts with its tag `[sync-i]` (SYNC_TAG), which the worker side uses to find the
pass that scored it. Loopback only: the plan's base_url is the service this run started.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx

POLL_S = 0.1
SYNC_TAG = "[sync-{index}] "
TIMEOUT_S = 600.0


async def submit_jobs(client: httpx.AsyncClient, jobs: list[dict]) -> list[dict]:
    submitted = []
    for job in jobs:
        sent = time.time()
        response = await client.post("/v1/jobs", json={"items": job["items"], "scoring": job["scoring"]})
        response.raise_for_status()
        submitted.append({"id": response.json()["id"], "submitted": sent, "ended": None})
    return submitted


async def follow_jobs(client: httpx.AsyncClient, jobs: list[dict]) -> None:
    """Poll until every job has ended; note when each was first seen ended."""
    while any(job["ended"] is None for job in jobs):
        for job in jobs:
            if job["ended"] is not None:
                continue
            view = (await client.get(f"/v1/jobs/{job['id']}")).json()
            if view["status"] not in ("queued", "running"):
                job |= {"ended": time.time(), "status": view["status"], "done": view["progress"]["done"],
                        "failed": view["progress"]["failed"]}
        await asyncio.sleep(POLL_S)


async def one_sync_call(client: httpx.AsyncClient, index: int, text: str, scoring: dict) -> dict:
    body = {"messages": [{"role": "user", "content": SYNC_TAG.format(index=index) + text}], "scoring": scoring}
    sent = time.time()
    try:
        response = await client.post("/v1/score", json=body)
    except httpx.HTTPError as error:  # a reset connection is a result too: counted, not raised
        return {"index": index, "sent": sent, "received": time.time(), "status": type(error).__name__, "job_id": None}
    row = {"index": index, "sent": sent, "received": time.time(), "status": response.status_code, "job_id": None}
    if response.status_code != 200:
        try:
            row["job_id"] = response.json().get("error", {}).get("job_id")
        except ValueError:  # not JSON: keep what the server said
            row["body"] = response.text[:200]
    return row


async def sync_calls(client: httpx.AsyncClient, sync: dict) -> list[dict]:
    tasks = []
    period = 1.0 / sync["rate_per_s"]
    start = time.monotonic()
    for index in range(sync["num_calls"]):
        await asyncio.sleep(max(0.0, start + index * period - time.monotonic()))
        text = sync["texts"][index % len(sync["texts"])]
        tasks.append(asyncio.create_task(one_sync_call(client, index, text, sync["scoring"])))
    return list(await asyncio.gather(*tasks))


async def run(plan: dict) -> dict:
    headers = {"Authorization": f"Bearer {plan['key']}"}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=plan["base_url"], headers=headers, timeout=TIMEOUT_S, limits=limits) as client:
        started = time.time()
        jobs = await submit_jobs(client, plan["jobs"])
        sync_task = asyncio.create_task(sync_calls(client, plan["sync"]))
        await follow_jobs(client, jobs)
        sync = await sync_task
    return {"started": started, "jobs": jobs, "sync": sync}


def main() -> None:
    plan_path, out_path = sys.argv[1], sys.argv[2]
    with open(plan_path) as file:
        plan = json.load(file)
    result = asyncio.run(run(plan))
    with open(out_path, "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main()
