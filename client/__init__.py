"""spinf-jobs client: `Client` (blocking) and `AsyncClient` (asyncio) over httpx; contract models only, no torch.

    from client import Client
    with Client() as spinf:                      # SPINF_BASE_URL, SPINF_API_KEY
        job = spinf.submit_file("rows.jsonl", {"queries": [...]})
        spinf.wait(job.id, progress=lambda view: print(view.progress.done, view.progress.total))
        for row in spinf.results(job.id): ...
docs/client.md lists every call.
"""

from client.async_client import AsyncClient
from client.calls import SpinfError
from client.sync_client import Client

__all__ = ["AsyncClient", "Client", "SpinfError"]
