"""CLI for the service: `spinf-jobs serve | api | worker | demo`.

    serve   embedded default: no SPINF_REDIS_URL -> local Redis in data_dir, API on :8000, one
            worker thread (CPU when there is no GPU)
    api     the HTTP API alone (scaled deployment, SPINF_REDIS_URL required)
    worker  one GPU worker (--device cuda:N), or one process per device (--devices all |
            cuda:0,cuda:1): loads its models once, drains their queue pairs greedily;
            SIGTERM hands its held chunks back to their queues, SIGINT finishes the batch first
    demo    serve + submit fixtures/demo as a job + progress + a summary

Settings come from SPINF_* env vars (contract/settings.py); the flags that matter per process
are made from those fields (spinf_jobs/setting_flags.py): `--device`, `--max-num-batched-tokens`
(serve, worker, demo) and `--packs DIR` (repeatable; serve, api, worker, demo: adds to
SPINF_PACK_DIRS; the API lists and checks the packs, the workers' engines apply them).
`--model` (repeatable) names the models this process loads; the first is the default model
unless SPINF_DEFAULT_MODEL is set. `add_service_commands(subparsers)` is wired into spinf_jobs/cli.py.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from contract.settings import Settings
from spinf_jobs.setting_flags import add_setting_flag, settings_from_args

DEMO_CHUNK_NUM_ROWS = 8  # small chunks: a live progress bar, and several chunks per pass
DEMO_MAX_NUM_BATCHED_TOKENS = 2048


def add_service_commands(subparsers) -> None:
    serve = subparsers.add_parser("serve", help="API + one worker (+ a local Redis when SPINF_REDIS_URL is unset)")
    _add_http_flags(serve)
    _add_engine_flags(serve)
    _add_packs_flag(serve)
    serve.set_defaults(handler=_serve)

    api = subparsers.add_parser("api", help="the HTTP API alone (needs SPINF_REDIS_URL)")
    _add_http_flags(api)
    _add_packs_flag(api)
    api.set_defaults(handler=_api)

    worker = subparsers.add_parser("worker", help="a worker: load models once, score queued jobs greedily")
    _add_engine_flags(worker)
    _add_packs_flag(worker)  # the workers' engines apply the packs the API accepts
    worker.add_argument("--name", default=None, help="worker name (default: host + random suffix)")
    worker.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    worker.add_argument("--devices", default=None, metavar="all|LIST",
                        help="one worker process per device: all (every visible GPU) or cuda:0,cuda:1 (cpu:0,cpu:1)")
    worker.set_defaults(handler=_worker)

    demo = subparsers.add_parser("demo", help="start the embedded service, score fixtures/demo as a job, summarise")
    _add_http_flags(demo)
    _add_engine_flags(demo)
    demo.add_argument("--dataset", type=Path, default=None, help="JSONL of {custom_id, text|messages}")
    demo.add_argument("--scoring", type=Path, default=None, help="scoring spec JSON ({queries: [...]})")
    demo.add_argument("--pack", action="append", default=[], metavar="ID",
                      help="also ask every row a prompt pack, e.g. spinf/support-triage (repeatable; GET /v1/packs)")
    _add_packs_flag(demo)
    # smaller passes than a server's: the progress bar moves pass by pass on a CPU (same scores)
    demo.set_defaults(handler=_demo, max_num_batched_tokens=DEMO_MAX_NUM_BATCHED_TOKENS)


def _add_http_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)


def _add_packs_flag(parser: argparse.ArgumentParser) -> None:
    add_setting_flag(parser, "pack_dirs", "--packs", metavar="DIR")


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", default=None, metavar="NAME",
                        help="served model name or local HF folder to load; repeat for several (default:"
                             f" SPINF_DEFAULT_MODEL, else {Settings.model_fields['default_model'].default})")
    add_setting_flag(parser, "device")
    add_setting_flag(parser, "max_num_batched_tokens", metavar="N")


def _settings(args: argparse.Namespace) -> Settings:
    import os

    settings = settings_from_args(args)
    models = getattr(args, "model", None)
    if models and "SPINF_DEFAULT_MODEL" not in os.environ:  # the first --model is the default
        settings = settings.model_copy(update={"default_model": models[0]})
    return settings


def _load(args: argparse.Namespace, settings: Settings) -> dict:
    from spinf_jobs.embedded import load_engines

    models = args.model or [settings.default_model]
    print(f"loading {', '.join(models)} on {settings.device} ...", file=sys.stderr)
    return load_engines(models, settings)


def _served_default(settings, engines: dict):
    """The default model must be a name the workers serve (a folder path becomes its served name)."""
    if settings.default_model in engines:
        return settings
    return settings.model_copy(update={"default_model": next(iter(engines))})


def _start_embedded(args: argparse.Namespace, needs_key: bool = False, chunk_num_rows: int | None = None):
    from spinf_jobs.embedded import EmbeddedService, embedded_settings, ensure_local_key

    settings, handle = embedded_settings(_settings(args))
    if chunk_num_rows:
        settings = settings.model_copy(update={"chunk_num_rows": chunk_num_rows})
    settings, token = ensure_local_key(settings, always=needs_key)
    engines = _load(args, settings)
    settings = _served_default(settings, engines)
    service = EmbeddedService(settings, engines, host=args.host, port=args.port, redis_handle=handle).start()
    return service, token


def _serve(args: argparse.Namespace) -> int:
    import threading

    service, token = _start_embedded(args)
    models = ", ".join(service.engines)
    print(f"spinf-jobs serving {models} at {service.base_url} (Redis: {service.settings.redis_url})")
    if token:
        print(f"API key (also in {service.settings.data_dir / 'api-key'}): {token}")
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    while not stopped.wait(1.0):
        if not service.worker_alive():  # dead past its restarts: the process says so and ends
            print(f"spinf-jobs: the worker died ({service.worker_thread.last_error}); stopping", file=sys.stderr)
            service.stop()
            return 1
    service.stop()
    return 0


def _api(args: argparse.Namespace) -> int:
    import uvicorn

    from api.app import create_app

    uvicorn.run(create_app(_settings(args)), host=args.host, port=args.port)
    return 0


def _worker(args: argparse.Namespace) -> int:
    from spinf_jobs.embedded import make_worker

    if args.devices:
        return _worker_per_device(args)
    settings = _settings(args)
    if not settings.redis_url and not settings.redis_sentinels:
        print("spinf-jobs worker needs SPINF_REDIS_URL or SPINF_REDIS_SENTINELS (or use `spinf-jobs serve`)",
              file=sys.stderr)
        return 2
    _use_device(settings.device)
    worker = make_worker(settings, _load(args, settings), name=args.name)
    signal.signal(signal.SIGINT, lambda *_: worker.stop())  # finish the batch in hand, then leave
    signal.signal(signal.SIGTERM, lambda *_: worker.request_hand_back())  # held chunks back to the queue
    print(f"worker {worker.name} on {worker.device} serving {', '.join(worker.engines)}", file=sys.stderr)
    worker.run(burst=args.burst)
    return 0


def _use_device(device: str) -> None:
    """cuda:N: make it this process's current CUDA device (the kernels launch on it)."""
    if device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(device)


def _worker_per_device(args: argparse.Namespace) -> int:
    from spinf_jobs.worker_devices import child_commands, devices_of, run_fleet

    try:
        devices = devices_of(args.devices)
    except ValueError as error:
        print(f"spinf-jobs worker: {error}", file=sys.stderr)
        return 2
    argv = sys.argv[sys.argv.index("worker"):]  # this command line, from the command on
    return run_fleet(child_commands(argv, devices, args.name))


def _demo(args: argparse.Namespace) -> int:
    from spinf_jobs.demo import run_demo

    logging.getLogger("rq").setLevel(logging.WARNING)  # keep the progress bar readable
    service, token = _start_embedded(args, needs_key=True, chunk_num_rows=DEMO_CHUNK_NUM_ROWS)
    try:
        return run_demo(service, token, args.dataset, args.scoring, args.pack)
    finally:
        service.stop()


def main(argv: list[str] | None = None) -> int:
    """`python -m spinf_jobs.service_commands ...`: the same commands without the top-level CLI."""
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(prog="spinf-jobs")
    add_service_commands(parser.add_subparsers(title="commands"))
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
