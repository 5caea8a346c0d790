"""What benchmarks/service_load.py writes: per sync call rows, and the Markdown of a result.

    sync_rows(client rows, PassLog.tagged, passes) -> [{index, status, sent, latency_s,
        pass_id, wait_s (pass start on the device - sent), pass_s}]
    markdown(result) -> the result's table (the JSON keeps every call and pass)
"""

from __future__ import annotations


def sync_rows(client_rows: list[dict], tagged: dict[int, dict], passes: list[dict]) -> list[dict]:
    """Each sync call with the pass that scored it: the first pass serving its row (a sync row
    fits one pass), and how long the call waited from being sent until that pass started."""
    by_id = {p["pass_id"]: p for p in passes}
    rows = []
    for client in sorted(client_rows, key=lambda row: row["index"]):
        seen = tagged.get(client["index"], {})
        pass_ids = seen.get("pass_ids", [])
        rode = by_id.get(pass_ids[0]) if pass_ids else None
        rows.append({
            "index": client["index"], "status": client["status"], "sent": client["sent"],
            "latency_s": client["received"] - client["sent"], "pass_ids": pass_ids,
            "wait_s": rode["gpu_start"] - client["sent"] if rode else None,
            "pass_s": rode["gpu_end"] - rode["gpu_start"] if rode else None,
            "done_after_pass_s": client["received"] - rode["gpu_end"] if rode else None,
        })
    return rows


def _f(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(result: dict) -> str:
    http, alone = result["systems"]["http"], result["systems"]["engine_alone"]
    sync, window = result["sync_calls"], result["sync_window"]
    lines = [
        f"# The service under load vs the engine alone: {result['workload']} on {result['model']}"
        f" ({result['gpu'] or result['device']}, {result['dtype']})",
        "",
        f"commit `{result['commit']}`, {result['date']}, `{result['command']}`.",
        f"{result['num_rows']} rows ({result['num_questions']} questions): {result['copies']} inline jobs of"
        f" {result['num_texts']} texts x every question (chunks of {result['chunk_num_rows']} rows; the worker"
        f" gathers {result.get('worker_batch_passes', 1)} passes of rows per batch) and"
        f" {sync['num']} `/v1/score` calls at {sync['rate_per_s']}/s ({sync['questions']} questions each), at"
        f" the same time; then the same rows through `Engine.score_batch`; pass budget"
        f" {result['max_num_batched_tokens']} tokens; both warm.",
        "",
        "| system | wall s | rows/s | questions/s | passes | median pass s | device busy | idle between passes s | host launch per pass s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in (("HTTP + Redis + worker", http), ("engine alone", alone)):
        p = row["passes"]
        lines.append(f"| {name} | {_f(row['wall_s'], 2)} | {_f(row['rows_per_s'], 1)} | {_f(row['questions_per_s'], 1)} |"
                     f" {p['num_passes']} | {_f(p['median_pass_s'])} | {_f(p['busy_share'] * 100, 1)}% |"
                     f" {_f(p['idle_between_passes_s'])} | {_f(p['host_launch_per_pass_s'], 4)} |")
    lines += [
        "",
        f"Through HTTP: **{result['http_share_of_engine_alone'] * 100:.1f}%** of the engine alone's questions/s.",
        "",
        f"Sync calls while the device was {_f(window['busy_share'] * 100, 1)}% busy ({window['num_passes']} batch passes,"
        f" median batch pass {_f(window['median_pass_s'])} s; {window.get('num_lane_passes', 0)} sync lane passes"
        f" beside them, median {_f(window.get('median_lane_pass_s'))} s on the device, host launch"
        f" {_f(window.get('host_launch_per_lane_pass_s'), 4)} s): status {sync['status']}; latency p50 {_f(sync['p50_s'])} s,"
        f" p99 {_f(sync['p99_s'])} s, max {_f(sync['max_s'])} s; p99 / median pass ="
        f" **{_f(sync['p99_over_median_pass'], 2)}**; median wait from sending to its pass starting"
        f" {_f(sync['median_wait_for_pass_s'])} s. The JSON lists every call: the pass it rode, its wait and latency.",
        f"The engine {'ran sync calls in passes of their own beside the batch passes (the sync lane: a high-priority stream on CUDA)' if result.get('sync_lane') else 'packed sync calls into the next batch pass'}.",
    ]
    return "\n".join(lines) + "\n"
