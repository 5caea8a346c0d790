"""The asyncio client: the same calls as `client.Client`, awaited (`async with AsyncClient() as c:`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Self

import httpx
import orjson

from client.calls import (
    ClientConfig,
    checked,
    dataset_body,
    is_finished,
    job_body,
    read_items,
    retry_delay,
)
from contract.payloads import JobList, JobView
from contract.protocol import ScoringRequest, ScoringResponse


class AsyncClient:
    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, max_retries: int = 5,
                 timeout_s: float = 120.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = ClientConfig.make(base_url, api_key, max_retries, timeout_s)
        self.http = httpx.AsyncClient(transport=transport, **self.config.httpx_args())

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        attempt = 0
        while True:
            response = await self.http.request(method, path, **kwargs)
            delay = retry_delay(response, attempt, self.config.max_retries)
            if delay is None:
                return checked(response)
            await asyncio.sleep(delay)
            attempt += 1

    async def score(self, request: ScoringRequest | dict) -> ScoringResponse:
        body = request.model_dump(mode="json", exclude_none=True) if isinstance(request, ScoringRequest) else request
        return ScoringResponse.model_validate((await self.request("POST", "/v1/score", json=body)).json())

    async def decide(self, body: dict) -> dict:
        return (await self.request("POST", "/v1/decide", json=body)).json()

    async def decisions(self, body: dict) -> dict:
        return (await self.request("POST", "/v1/decisions", json=body)).json()

    async def submit(self, items: Iterable, scoring=None, packs: Iterable[str] = (), model: str | None = None
                     ) -> JobView:
        return await self._create(job_body(items, scoring, packs, model))

    async def submit_file(self, path: Path | str, scoring=None, packs: Iterable[str] = (), model: str | None = None
                          ) -> JobView:
        return await self.submit(read_items(path), scoring, packs, model)

    async def submit_dataset(self, input_uri: str, output_uri: str, scoring=None, packs: Iterable[str] = (),
                             model: str | None = None) -> JobView:
        return await self._create(dataset_body(input_uri, output_uri, scoring, packs, model))

    async def _create(self, body: dict) -> JobView:
        return JobView.model_validate((await self.request("POST", "/v1/jobs", json=body)).json())

    async def job(self, job_id: str) -> JobView:
        return JobView.model_validate((await self.request("GET", f"/v1/jobs/{job_id}")).json())

    async def wait(self, job_id: str, progress: Callable[[JobView], None] | None = None, poll_s: float = 0.5,
                   timeout_s: float | None = None) -> JobView:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            view = await self.job(job_id)
            if progress is not None:
                progress(view)
            if is_finished(view):
                return view
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {view.status.value}")
            await asyncio.sleep(poll_s)

    async def results(self, job_id: str) -> AsyncIterator[dict]:
        attempt = 0
        while True:
            async with self.http.stream("GET", f"/v1/jobs/{job_id}/results") as response:
                if response.status_code < 400:
                    async for line in response.aiter_lines():
                        if line.strip():
                            yield orjson.loads(line)
                    return
                await response.aread()
                delay = retry_delay(response, attempt, self.config.max_retries)
                if delay is None:
                    checked(response)
            await asyncio.sleep(delay)
            attempt += 1

    async def cancel(self, job_id: str) -> JobView:
        return JobView.model_validate((await self.request("POST", f"/v1/jobs/{job_id}/cancel")).json())

    async def jobs(self, page_size: int = 20) -> AsyncIterator[JobView]:
        params: dict = {"limit": page_size}
        while True:
            page = JobList.model_validate((await self.request("GET", "/v1/jobs", params=params)).json())
            for view in page.data:
                yield view
            if not page.has_more:
                return
            params["after"] = page.last_id
