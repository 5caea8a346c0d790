"""The throughput result as files: JSON as measured, Markdown for people.

    write_result(result, final) -> benchmarks/results/throughput-<model>-<workload>[-variant].{json,md}
    markdown(result): the systems' table (each row says what the system does), the spinf
        systems' host columns and timelines, how many times faster spinf is than each prefix
        baseline, the agreement between systems, hf_prefix_batched's sweep, the scaling sweeps
"""

from __future__ import annotations

from result_files import write_pair
from timeline import brief

DECODING_KERNELS = {  # ops.DECODING_MATMULS and decode_attention.DECODING_ATTENTION, as the report names them
    "tiles": "the persistent matmul with tiles for few rows (matmul.decoding_tiles, the scoring passes' bits)",
    "split_k": "the split-K matmul (engine/kernels/matmul_split_k.py)",
    "blas": "cuBLAS in calls of a fixed number of rows (matmul.matmul_blas_blocks)",
    "scoring": "the scoring passes' tiles (matmul.BF16_TILES)",
    "triton": "one Triton kernel per group and layer (engine/kernels/decode_attention.py)",
    "sdpa": "SDPA over each group's entries at full capacity",
}

WHAT_IT_DOES = {  # in the table's order
    "spinf_bf16": "this engine: each content once and each question's suffix, packed into {budget}-token passes"
                  " with tree attention",
    "spinf_bf16_slots": "spinf_bf16 with extraction slots added to every request",
    "spinf_fp8": "spinf_bf16's passes with fp8 (e4m3) weights and activations",
    "spinf_fp8_gate_up_unfused": "spinf_fp8 with act(gate) * up in its own kernel after the gate_up matmul (same"
                                 " engine, same run)",
    "spinf_fp8_gate_up_fused": "spinf_fp8 with act(gate) * up in the gate_up matmul's epilogue"
                               " (engine/kernels/fp8_gate_up.py; same engine, same run)",
    "hf_prefix_batched": "transformers: G contents' trunks in one left-padded forward (DynamicCache), then their"
                         " questions C rows per forward over each row's trunk K/V (right-padded, position ids after"
                         " each trunk)",
    "hf_prefix": "transformers: one content at a time: its K/V in a batch-1 forward, then all its questions in one"
                 " forward over that cache repeated per question (right-padded)",
    "hf_naive": "transformers: each (content, question) its own sequence, right-padded batches of 32, LM head at the last token",
}


def write_result(result: dict, final: bool = True) -> None:
    """The JSON + Markdown pair; `complete` is false until every asked-for system has run."""
    result["complete"] = final
    write_pair(result, markdown(result), "throughput", result["model"], result["workload"], result["variant"])
    if final:
        print(markdown(result))


def speedups(result: dict) -> dict:
    """spinf's questions/s over each prefix baseline's (the best hf_prefix_batched point)."""
    systems = result["systems"]
    return {f"{spinf}_vs_{baseline}": systems[spinf]["questions_per_s"] / systems[baseline]["questions_per_s"]
            for spinf in ("spinf_bf16", "spinf_fp8") for baseline in ("hf_prefix", "hf_prefix_batched")
            if spinf in systems and baseline in systems}


def _name(name: str, row: dict) -> str:
    if name == "hf_prefix_batched":
        name += f" (best: G = {row['group']}, C = {row['chunk'] or 'all'})"
    return name + (f" (on {row['measured_on_texts']} texts)" if "measured_on_texts" in row else "")


def markdown(result: dict) -> str:
    peaks = ", ".join(f"{kind} {value:.3g}" for kind, value in result["peak_tflops"].items())
    lines = [
        f"# {result['workload']} on random-weight {result['model']} ({result['gpu']})",
        "",
        f"commit `{result['commit'][:12]}`, {result['date']}, torch {result['torch']}, {result['num_texts']} texts,"
        f" {result['num_questions']} questions, median of {result['repeats']} timed repeats after warm-up.",
        f"Peaks measured in this run ({result['peak_method']}): {peaks} TFLOP/s.",
        *([] if result.get("complete", True) else ["", "**Incomplete: the run stopped before every system had run.**"]),
        "",
        "| system | questions/s | tokens/s | seconds | MFU | batch invariant | what it does |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name, row in sorted(result["systems"].items(), key=lambda item: list(WHAT_IT_DOES).index(item[0])):
        does = WHAT_IT_DOES.get(name, "").format(budget=f"{result['budget_tokens']:,}")
        lines.append(f"| {_name(name, row)} | {row['questions_per_s']:.1f} | {row['tokens_per_s']:.0f} | {row['seconds']:.3f} |"
                     f" {row['mfu']:.1%} | {row.get('batch_invariant')} | {does} |")
    ratios = speedups(result)
    if ratios:
        lines.append("\nquestions/s over the prefix baselines': " + "; ".join(f"{k.replace('_vs_', ' / ')} {v:.2f}x"
                                                                           for k, v in ratios.items()))
    lines += _host_lines(result)
    for name, row in result["systems"].items():
        if "same_bits_as_spinf_fp8" in row:
            lines.append(f"\n{name}: {row['questions_per_s'] / result['systems']['spinf_fp8']['questions_per_s']:.3f}x"
                         f" spinf_fp8's questions/s; the same log-probs bit for bit: {row['same_bits_as_spinf_fp8']}")
    for key in ("spinf_bf16_vs_hf_prefix", "hf_naive_vs_hf_prefix", "hf_prefix_batched_vs_hf_prefix", "fp8_vs_bf16_drift"):
        if key in result:
            d = result[key]
            lines.append(f"\n{key}: mean |Δlogprob| {d['mean_abs']:.4f}, max {d['max_abs']:.4f} nats over {d['items']} items")
    lines += _prefix_batched_lines(result)
    if "sweeps" in result:
        lines += ["", "## Sweeps (spinf_bf16 vs hf_prefix, seconds per content)", "",
                  "| sweep | value | spinf_bf16 s | hf_prefix s | tokens per content |", "|---|---:|---:|---:|---:|"]
        for row in result["sweeps"]:
            lines.append(f"| {row['sweep']} | {row['value']} | {row['spinf_s']:.4f} | {row['hf_prefix_s']:.4f} | {row['tokens']} |")
    return "\n".join(lines) + "\n"


def _host_lines(result: dict) -> list[str]:
    lines = []
    for name, row in result["systems"].items():
        if "runner_seconds" in row:
            lines.append(f"\n{name}: {row['passes']} passes; launch (block masks, copies, kernel launches, and any wait for the GPU inside them) {row['runner_seconds']:.3f} s of"
                         f" {row['seconds']:.3f} s; tokenization {row['tokenize_seconds']:.3f} s more (not in the table:"
                         f" the baselines get tokenized input too)"
                         + (f"; garbage collector {row['gc_seconds']:.3f} s per run" if "gc_seconds" in row else ""))
        if "timeline" in row:
            lines.append(f"\n{name} timeline of one more run (benchmarks/timeline.py): {brief(row['timeline'])}")
    if "spinf_bf16_slots" in result["systems"]:
        row = result["systems"]["spinf_bf16_slots"]
        lines.append(f"\nspinf_bf16_slots: the same requests plus {row['num_slot_queries']} extraction slots each"
                     f" ({row['slot_answers']} slot answers): +{row['slot_extra_seconds']:.3f} s ="
                     f" {row['slot_scoring_token_equivalents']:.0f} scoring-token equivalents"
                     f" ({row['slot_scoring_token_equivalents_per_answer']:.1f} per slot answer);"
                     f" {row['slot_tokens']} decoding rows vs {row['read_tokens']} tokens read;"
                     f" questions/s counts the option questions only")
        for kind, part in row.get("by_kind", {}).items():
            lines.append(f"\n- {kind} slots alone ({', '.join(part['slot_ids'])}; {part['slot_answers']} answers):"
                         f" +{part['slot_extra_seconds']:.3f} s ="
                         f" {part['slot_scoring_token_equivalents_per_answer']:.1f} scoring-token equivalents per answer;"
                         f" {part['decoding_rows_per_answer']:.1f} decoding rows and"
                         f" {part['tokens_written_per_answer']:.1f} tokens written per answer"
                         f" ({part['empty_answers']} without an answer)")
        if row.get("decoding_passes_per_run"):
            counts = row["decoding_passes_per_run"]
            lines.append(f"\n- decoding passes per run (CUDA graphs, engine/pipeline/decode_graphs.py): {counts['eager']:g} eager,"
                         f" {counts['replayed']:g} replayed ({counts['captured']:g} captured)"
                         + (f"; host time per run launching the eager ones (waits behind a full launch queue"
                            f" included) {counts['eager_seconds']:.3f} s, capturing {counts['capture_seconds']:.3f} s"
                            if "eager_seconds" in counts else ""))
        if "one_run" in row:
            part = row["one_run"]
            on_device = ("" if part["pass_device_seconds"] is None else
                         f" {part['decoding_passes']} passes take {part['pass_device_seconds']:.3f} s on the device;")
            lines.append(f"\n- one more run, by part: {part['seconds']:.3f} s = read passes {part['read_seconds']:.3f} s"
                         f" + decoding {part['decoding_seconds']:.3f} s; in the decoding,{on_device} the passes' calls"
                         f" (pass, selection, copies) {part['decode_call_seconds']:.3f} s; the host between them"
                         f" {part['decoding_host_seconds']:.3f} s (batches built {part['prepare_seconds']:.3f} s,"
                         f" beams advanced {part['advance_seconds']:.3f} s)")
        if "eager_decode" in row:
            lines.append(_variant_line("every decoding pass launched kernel by kernel (no CUDA graphs)", row["eager_decode"]))
        for setting, what in (("decoding_matmul", "projections"), ("decoding_attention", "attention")):
            for choice, other in row.get(f"other_{setting}", {}).items():
                lines.append(_variant_line(f"the decoding passes' {what} on {DECODING_KERNELS.get(choice, choice)}"
                                           f" (this run's default: {DECODING_KERNELS.get(row[setting], row[setting])})", other))
        if "other_trunks" in row:
            other = row["other_trunks"]
            how = ("the slots of one content reading the prompt rows they share from one sibling's arena entry"
                   if other["shared_trunks"] else "each slot reading its own copy of the prompt rows its content's slots share")
            lines.append(_variant_line(f"{how} (SHARED_TRUNKS = {other['shared_trunks']})", other))
        if "other_compaction" in row:
            other = row["other_compaction"]
            lines.append(_variant_line(f"the decoding layouts packed again once half their rows are held {_compaction_scope(other)}"
                                       f" (HELD_ROWS_WORTH_COMPACTING = {other['held_rows_worth_compacting']})", other))
        if "other_trunks_compaction" in row:
            both = row["other_trunks_compaction"]
            lines.append(_variant_line(f"both other settings: SHARED_TRUNKS = {both['shared_trunks']},"
                                       f" HELD_ROWS_WORTH_COMPACTING = {both['held_rows_worth_compacting']}", both))
    return lines


def _variant_line(what: str, variant: dict) -> str:
    """One same-run variant of the slots: its extra seconds and scoring-token equivalents per answer."""
    return (f"\n- the same slots with {what}: +{variant['slot_extra_seconds']:.3f} s ="
            f" {variant['slot_scoring_token_equivalents_per_answer']:.1f} scoring-token equivalents per answer")


def _compaction_scope(row: dict) -> str:
    rows = row["held_rows_worth_compacting"]
    return "whatever their size" if rows == 0 else f"only for layouts of {rows} rows or more"


def _prefix_batched_lines(result: dict) -> list[str]:
    if "hf_prefix_batched_sweep" not in result:
        return []
    lines = ["", "## hf_prefix_batched: G contents per trunk forward, C question rows per question forward", "",
             "| C (question rows) | G (contents) | questions/s | seconds | MFU | peak GPU GiB |", "|---:|---:|---:|---:|---:|---:|"]
    for row in result["hf_prefix_batched_sweep"]:
        head = f"| {row['chunk'] or 'all'} | {row['group']} |"
        if row.get("oom"):
            lines.append(f"{head} oom | | | |")
            continue
        peak = "" if row["peak_gpu_gib"] is None else f"{row['peak_gpu_gib']:.1f}"
        rate = f"{row['questions_per_s']:.1f}" + ("" if row["finite"] else " (non-finite log-probs)")
        lines.append(f"{head} {rate} | {row['seconds']:.3f} | {row['mfu']:.1%} | {peak} |")
    best = result["systems"].get("hf_prefix_batched")
    lines.append("\nbest: " + (f"G = {best['group']}, C = {best['chunk'] or 'all'}, {best['questions_per_s']:.1f} questions/s"
                               if best else "none (no point ran with finite log-probs in memory)"))
    return lines
