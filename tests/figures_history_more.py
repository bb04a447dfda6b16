"""The figures of docs/results_history.md's later sections: tensor parallelism, replay, other
checks (tests/figures.py says how a claim reads)."""

from __future__ import annotations

from figures import Claim

PAGE = "docs/results_history.md"


def c(files, text: str) -> Claim:
    return Claim(PAGE, files, text)


SPEED_BLOCKS = "gpu_runs/gpu-methods-blocks/h200_drafter_speed.json"
REPLAY = [
    c(
        "methods/drafter_replay_cpu.json",
        "(EAGLE-3 held-out: {f.results.where(method='eagle3', prompt_set='heldout').served.drafts} "
        "drafts, {f.results.where(method='eagle3', prompt_set='heldout').served.accepted} "
        "accepted; DFlash k = 7: {f.results.where(method='dflash', k=7, prompt_set='heldout')"
        ".served.drafts} and {f.results.where(method='dflash', k=7, prompt_set='heldout')"
        ".served.accepted}; `methods/drafter_replay_cpu.json`)",
    ),
    c(
        {
            "r": "methods/gpu-methods-blocks_cpu_replay.json",
            "p": "methods/gpu-methods-blocks_cpu_proposals.json",
            "b": SPEED_BLOCKS,
        },
        "served on the CPU within {max([abs(x.served - x.replay) for x in r.table]) + 0.0005|.3f}"
        " of τ in all {len(r.table)} (block, k, set) cells, vLLM proposing the replay's tokens at "
        "{p.checks[0].summary.identical} of {p.checks[0].summary.steps} steps; their gap to "
        "validation's "
        "{b.rows.where(method='dflash').predicted_acceptance_length|.2f} and "
        "{b.rows.where(method='dflash_b8').predicted_acceptance_length|.2f}",
    ),
]

TP = "tensor_parallel/"


def acc_diff(a: str, i: int, b: str, j: int) -> str:
    return " / ".join(
        f"{{{a}[{i}].final_val_full_acc[{s}] - {b}[{j}].final_val_full_acc[{s}]|+.4f}}"
        for s in range(3)
    )


def kv(alias: str) -> str:
    return f"[x['kv_cache_usage'] for x in {alias}.requests if x['ok']]"


TENSOR_PARALLEL = [
    c(
        f"{TP}compare_tp1_tp3.json",
        "| extraction at TP=3 against TP=1, {f.rows} rows, {f.tokens} tokens, float32 serving, "
        "bf16 "
        "storage | max relative error per layer {f.rel_error_max_per_layer['2']|.1e} (layer 2), "
        "{f.rel_error_max_per_layer['15']|.1e} (15), {f.rel_error_max_per_layer['27']|.1e} (27), "
        "{f.rel_error_max_per_layer['30']|.1e} (final); "
        "{span([v * 100 for v in f.bf16_identical_fraction_per_layer.value.values()])|.2f}% of "
        "stored bf16 "
        "values bit-identical; next-token agreement {f.next_token_agreement_a * 100|.3f}% at both, "
        "argmaxes equal everywhere |",
    ),
    c(
        {"n": f"{TP}leak_tp3_no_override.json"},
        "| TP=3 without the `get_finished_count` override, KV cache cut to "
        "{n.num_gpu_blocks_override} blocks of 128 tokens | "
        "{len([x for x in n.requests if x['ok']])} rows answered, the 9th timed out after "
        "{n.timeout_s|.0f} s; KV-cache usage climbs {lo(" + kv("n") + ")|.2f} → "
        "{hi(" + kv("n") + ")|.2f} |",
    ),
    c(
        {"p": f"{TP}leak_tp3_pipeline.json", "o": f"{TP}leak_tp1_no_override.json"},
        "| TP=3 with the pipeline's connector; TP=1 without the override | "
        "{len([x for x in p.requests if x['ok']])} of {len(p.requests)} rows each, KV-cache usage "
        "{hi(" + kv("p") + " + " + kv("o") + ")|.2f} after every answer |",
    ),
    c(
        {"a": f"{TP}train_1v2_seed0.json", "b": f"{TP}train_1v2_seed1.json"},
        "full accuracy per TTT step differs by "
        + acc_diff("a", 1, "a", 0)
        + " (seed 0) and "
        + acc_diff("b", 1, "b", 0)
        + " (seed 1), validation loss "
        "{a[1].final_val_loss - a[0].final_val_loss|+.2f} and "
        "{b[1].final_val_loss - b[0].final_val_loss|+.2f}: no consistent direction, within one "
        "process's seed-to-seed spread ("
        + " / ".join(
            f"{{abs(a[0].final_val_full_acc[{s}] - b[0].final_val_full_acc[{s}])|.4f}}"
            for s in range(3)
        )
        + ", loss {abs(a[0].final_val_loss - b[0].final_val_loss)|.2f})",
    ),
    c(
        f"{TP}test_tensor_parallel_runs.txt",
        "TP=3 extraction {span(f.numbers('([0-9.]+)s call +[^ ]+extraction_equals_tp1\\n"
        "(?:(?![^\\n]*failed)[^\\n]*\\n)*?[0-9]+ passed'))|.0f} s, two-process training "
        "{span(f.numbers('([0-9.]+)s call +[^ ]+test_two_process_training'))|.0f} s",
    ),
]


GATE = "gate/ci_memorized_floor.json"


def gate_seeds(field: str, spec: str) -> str:
    return ", ".join(
        f"{{f.seeds['{s}'].runs.where(prompt_set='memorized'){field}|{spec}}}" for s in "012"
    )


OTHER_CHECKS = [
    c(
        GATE,
        "τ at k = 2 "
        + gate_seeds(".acceptance_length", ".3f")
        + "; position 1 "
        + gate_seeds(".per_position[0]", ".3f")
        + " (other sets "
        "{span([r.acceptance_length for s in f.seeds.value for r in f.seeds[s].runs "
        "if r['prompt_set'] != 'memorized'])|.2f}). The CI config's floors lie "
        "{f.margin * 100|.0f}% of the worst seed's gain below it: τ "
        "{f.floors[0].acceptance_length|.2f}, position 1 {f.floors[0].per_position[0]|.2f}",
    ),
    c(
        "checks/mla_extraction.json",
        "(relative error {span(f.rel_error_vs_transformers_fp32.value.values())|.3f}; one position "
        "off: {span(f.control_rel_error_one_position_off.value.values())|.2f};",
    ),
]

SLURM = [
    c(
        "scale_out/slurm_ci_run.json",
        "all {len([j for j in f.jobs if j['state'] == 'COMPLETED'])} jobs COMPLETED in `sacct` "
        "within their limits (synth parts "
        "{clock(f.jobs.where(rule='synth', wildcards='0').elapsed)} and "
        "{clock(f.jobs.where(rule='synth', wildcards='1').elapsed)} s, extraction "
        "{clock(f.jobs.where(rule='extract', wildcards='0').elapsed)} and "
        "{clock(f.jobs.where(rule='extract', wildcards='1').elapsed)} s, train "
        "{clock(f.jobs.where(rule='train').elapsed) // 60} min "
        "{clock(f.jobs.where(rule='train').elapsed) % 60} s on "
        "{f.jobs.where(rule='train').nodes} nodes, bench "
        "{clock(f.jobs.where(rule='bench').elapsed) // 60} min "
        "{clock(f.jobs.where(rule='bench').elapsed) % 60} s); {f.workflow_wall_s|,.0f} s in all, "
        "beside another run (load {f.load_after[0]|.1f})",
    ),
]


def summary(alias: str, shape: str, variant: str, key: str, spec: str, scale: str = "") -> str:
    at = f"{alias}.shapes['{shape}'].summary.{variant}.{key}"
    return f"{{{at}.median{scale}|{spec}}} ({{{at}.min{scale}|{spec}}}–{{{at}.max{scale}|{spec}}})"


def med(alias: str, shape: str, variant: str, key: str, spec: str, scale: str = "") -> str:
    return f"{{{alias}.shapes['{shape}'].summary.{variant}.{key}.median{scale}|{spec}}}"


def pair(key: str, spec: str, sep: str, shape: str = "llama-8b", spread: bool = True) -> str:
    """The copying validator's figure, then the current one's (``sep`` between)."""
    one = summary if spread else med
    return sep.join(one("f", shape, v, key, spec) for v in ("copying", "current"))


def loops(spread: bool = True) -> str:
    """The busy thread's loops a second, in thousands (copying, then current)."""
    one = summary if spread else med
    return " → ".join(
        one("f", "llama-8b", v, "busy_loops_per_s", ".1f", " / 1e3").replace("|.1f}", "|.1f}K")
        for v in ("copying", "current")
    )


VALIDATOR_COST = [
    c(
        "efficiency/validator_cost_cpu_copying.json",
        "page faults a sample "
        + pair("page_faults_per_sample", ".0f", " → ")
        + ", system CPU "
        + pair("system_cpu_ms_per_sample", ".1f", " → ", spread=False)
        + " ms, wall "
        + pair("wall_ms_per_sample", ".1f", " → ")
        + " ms, the busy thread's loops a second "
        + loops()
        + "; at the 135M width nothing beyond the spread ("
        + pair("wall_ms_per_sample", ".1f", " → ", "smollm2-135m", spread=False)
        + " ms)",
    ),
    c(
        "efficiency/h200_host_validator_cost_copying.json",
        " against ".join(
            summary("f", "llama-8b", v, "wall_ms_per_sample", ".2f") for v in ("current", "copying")
        )
        + " ms a sample, {f.shapes['llama-8b'].summary.copying.wall_ms_per_sample.median / "
        "f.shapes['llama-8b'].summary.current.wall_ms_per_sample.median|.2f}×, system CPU "
        + " against ".join(
            med("f", "llama-8b", v, "system_cpu_ms_per_sample", ".1f")
            for v in ("current", "copying")
        )
        + " ms, page faults "
        + " and ".join(
            med("f", "llama-8b", v, "page_faults_per_sample", ".0f") for v in ("current", "copying")
        )
        + ", loops "
        + " and ".join(
            med("f", "llama-8b", v, "busy_loops_per_s", ".1f", " / 1e3") + "K"
            for v in ("current", "copying")
        )
        + "; 135M "
        + " against ".join(
            med("f", "smollm2-135m", v, "wall_ms_per_sample", ".2f") for v in ("current", "copying")
        )
        + " ms",
    ),
    c(
        "efficiency/validator_cost_cpu_busy_thread.json",
        "to {f.shapes['llama-8b'].runs[0].wall_ms_per_sample|.0f} ms beside a busy Python thread "
        "at Python's 5 ms interval, and to {f.shapes['llama-8b'].runs[1].wall_ms_per_sample|.1f} "
        "ms at 0.5 ms",
    ),
]

E = "efficiency/"
BEFORE_ROUNDS = [
    c(
        E + "synth_throughput.json",
        "| {f.ratio|.2f} ({f.median.pipeline|.1f} / {f.median.bare|.1f}) | 3 |",
    ),
    c(
        E + "synth_throughput_profile_cpu.json",
        "| {f.ratio|.3f} ({f.median.pipeline|.1f} / {f.median.bare|.1f}) | 2 |",
    ),
    c(
        E + "h200_synth_throughput.json",
        "| {f.ratio|.3f} ({f.median.pipeline|,.0f} / {f.median.bare|,.0f}; bare rounds "
        "{f.runs.bare[0]|,.0f} and {f.runs.bare[1]|,.0f}) | 2 |",
    ),
    c(
        E + "extract_throughput.json",
        "| {f.ratio|.3f} ({f.median.extract|.0f} / {f.median.bare|.0f}) | 3 |",
    ),
    c(
        E + "h200_extract_throughput_135m.json",
        "| {f.ratio|.3f} ({f.median.extract / 1e3|.1f}K / {f.median.bare / 1e3|.1f}K) | 2 |",
    ),
    c(
        E + "h200_extract_throughput_8b.json",
        "| {f.ratio|.3f} ({f.median.extract / 1e3|.1f}K / {f.median.bare / 1e3|.1f}K) | 3 |",
    ),
]
