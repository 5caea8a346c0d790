"""The asyncio client: the same calls as `client.Client`, awaited (`async with AsyncClient() as c:`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Self

import httpx

from client import calls
from contract.payloads import JobView
from contract.protocol import ScoringRequest
from contract.scoring_results import ScoringResponse


class AsyncClient:
    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, max_retries: int = 5,
                 timeout_s: float = 120.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = calls.ClientConfig.make(base_url, api_key, max_retries, timeout_s)
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
            delay = calls.retry_delay(response, attempt, self.config.max_retries)
            if delay is None:
                return calls.checked(response)
            await asyncio.sleep(delay)
            attempt += 1

    async def _send(self, call: calls.Call):
        return call.read(await self.request(call.method, call.path, **call.options))

    async def score(self, request: ScoringRequest | dict) -> ScoringResponse:
        return await self._send(calls.score_call(request))

    async def decide(self, body: dict) -> dict:
        return await self._send(calls.decide_call(body))

    async def decisions(self, body: dict) -> dict:
        return await self._send(calls.decisions_call(body))

    async def submit(self, items: Iterable, scoring=None, packs: Iterable[str] = (), model: str | None = None
                     ) -> JobView:
        return await self._send(calls.create_job_call(calls.job_body(items, scoring, packs, model)))

    async def submit_file(self, path: Path | str, scoring=None, packs: Iterable[str] = (), model: str | None = None
                          ) -> JobView:
        return await self.submit(calls.read_items(path), scoring, packs, model)

    async def submit_dataset(self, input_uri: str, output_uri: str, scoring=None, packs: Iterable[str] = (),
                             model: str | None = None) -> JobView:
        return await self._send(calls.create_job_call(calls.dataset_body(input_uri, output_uri, scoring, packs, model)))

    async def job(self, job_id: str) -> JobView:
        return await self._send(calls.job_call(job_id))

    async def wait(self, job_id: str, progress: Callable[[JobView], None] | None = None, poll_s: float = 0.5,
                   timeout_s: float | None = None) -> JobView:
        waiting = calls.JobWait(job_id, progress, timeout_s)
        while not waiting.ended(view := await self.job(job_id)):
            await asyncio.sleep(poll_s)
        return view

    async def results(self, job_id: str) -> AsyncIterator[dict]:
        attempt = 0
        while True:
            async with self.http.stream("GET", calls.results_path(job_id)) as response:
                if response.status_code < 400:
                    async for line in response.aiter_lines():
                        if (row := calls.result_row(line)) is not None:
                            yield row
                    return
                await response.aread()
                delay = calls.retry_delay(response, attempt, self.config.max_retries)
                if delay is None:
                    calls.checked(response)
            await asyncio.sleep(delay)
            attempt += 1

    async def cancel(self, job_id: str) -> JobView:
        return await self._send(calls.cancel_call(job_id))

    async def jobs(self, page_size: int = 20) -> AsyncIterator[JobView]:
        pages = calls.JobPages(page_size)
        while pages.more:
            for view in await self._send(pages.next_call()):
                yield view
