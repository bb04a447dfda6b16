"""The figures of docs/results.md on the methods, scale-out, re-runs and hidden states without the
disk, with the files they come from (tests/figures.py says how a claim reads)."""

from __future__ import annotations

from figures import Claim
from figures_results_data import RUN_19K, RUN_2441, RUN_9886, SETS, drafter

PAGE = "docs/results.md"


def c(files, text: str) -> Claim:
    return Claim(PAGE, files, text)


SPEED_2441 = f"{RUN_2441}h200_drafter_speed.json"
SPEED_BLOCKS = "gpu_runs/gpu-methods-blocks/h200_drafter_speed.json"
CPU_9886 = "methods/gpu-methods_cpu_tau.json"
W4A16_BENCH = "gpu_runs/kimi-miniature-w4a16-h100-drafter/bench/eagle3/metrics.json"
# every round's speedup over the sets the W4A16 miniature's drafter was benchmarked on
W4A16_SPEEDUPS = "{span([x for r in f.runs.value for x in r['speedup_range']])|.2f}"


def taus(alias: str, method: str, k: int, key: str = "rows", sets=tuple(SETS)) -> str:
    return " | ".join(
        f"{{{alias}.{key}.where(method={method!r}, k={k}, prompt_set={s!r}, concurrency=1)"
        ".acceptance_length|.2f}"
        if s
        else ""
        for s in sets
    )


def h200_method_row(label: str, method: str, k: int, file: str) -> str:
    at = f"f.rows.where(method={method!r}, k={k}, concurrency=1)"
    return f"| {label} | {taus('f', method, k)} | {{{at}.predicted_acceptance_length|.2f}} | "


def differing(alias: str, method: str) -> str:
    """How many HumanEval outputs differ from the baseline's at concurrency 1."""
    at = f"{alias}.rows.where(method={method!r}, prompt_set='humaneval', concurrency=1)"
    return f"{{{at}.outputs_vs_baseline.differing}}"


def gain(tau_: str, predicted: str) -> str:
    return f"({tau_} - 1) / ({predicted} - 1)"


METHODS = [
    c(
        "methods/methods_cpu.json",
        "| EAGLE-3, 3; DFlash (5 layers, block 8), 3 and 7 | "
        + " | ".join(
            f"{{f.bench.where(method='eagle3', prompt_set={s!r}).acceptance_length|.2f}}; "
            f"{{f.bench.where(method='dflash', k=3, prompt_set={s!r}).acceptance_length|.2f}}"
            for s in SETS
        )
        + " | {f.bench.where(method='eagle3').predicted_acceptance_length|.2f}; "
        "{f.bench.where(method='dflash', k=3).predicted_acceptance_length|.2f} and "
        "{f.bench.where(method='dflash', k=7).predicted_acceptance_length|.2f} |",
    ),
    c(
        SPEED_2441,
        "| 2,441 rows, H200 (80 / 40 / 40) | EAGLE-3, 3 | "
        + taus("f", "eagle3", 3)
        + " | {f.rows.where(method='eagle3', concurrency=1).predicted_acceptance_length|.2f} |",
    ),
    c(SPEED_2441, h200_method_row("the same | DFlash block 16, 3", "dflash", 3, SPEED_2441)),
    c(
        SPEED_BLOCKS,
        h200_method_row("the same prompts, H200 | DFlash block 16, 15", "dflash", 15, SPEED_BLOCKS),
    ),
    c(SPEED_BLOCKS, h200_method_row("the same | DFlash block 8, 7", "dflash_b8", 7, SPEED_BLOCKS)),
    c(
        {"f": CPU_9886, "d": drafter(RUN_9886)},
        "| 9,886 rows, CPU (80 / – / 40; c = 8) | EAGLE-3, 3 | "
        "{f.results.where(method='eagle3', prompt_set='mtbench').acceptance_length|.2f} | | "
        "{f.results.where(method='eagle3', prompt_set='heldout').acceptance_length|.2f} | "
        "{1 + d.prediction.cond_acc[0] + d.prediction.cond_acc[0] * d.prediction.cond_acc[1] + "
        "d.prediction.cond_acc[0] * d.prediction.cond_acc[1] * d.prediction.cond_acc[2]|.2f} |",
    ),
    c(
        {"f": CPU_9886, "d": drafter(RUN_9886, "dflash")},
        "| the same | DFlash block 16, 15 | "
        "{f.results.where(method='dflash', prompt_set='mtbench').acceptance_length|.2f} | | "
        "{f.results.where(method='dflash', prompt_set='heldout').acceptance_length|.2f} | "
        "{d.prediction.eal|.2f} |",
    ),
    c(
        {
            "cpu": "methods/methods_cpu.json",
            "a": SPEED_2441,
            "g": "gpu_runs/gpu-methods/bench/eagle3/metrics.json",
            "c9": CPU_9886,
            "d": drafter(RUN_9886, "dflash"),
        },
        "EAGLE-3 {span(["
        + gain(
            "cpu.bench.where(method='eagle3', prompt_set='heldout').acceptance_length",
            "cpu.bench.where(method='eagle3').predicted_acceptance_length",
        )
        + ", "
        + gain(
            "a.rows.where(method='eagle3', prompt_set='heldout', concurrency=1).acceptance_length",
            "a.rows.where(method='eagle3').predicted_acceptance_length",
        )
        + ", "
        + gain(
            "g.runs.where(prompt_set='heldout', concurrency=1).acceptance_length",
            "g.runs.where(prompt_set='heldout').predicted_acceptance_length",
        )
        + ", "
        + gain(
            "c9.results.where(method='eagle3', prompt_set='heldout').acceptance_length",
            "g.runs.where(prompt_set='heldout').predicted_acceptance_length",
        )
        + "])|.2f}; DFlash {"
        + gain(
            "a.rows.where(method='dflash', prompt_set='heldout', concurrency=1).acceptance_length",
            "a.rows.where(method='dflash').predicted_acceptance_length",
        )
        + "|.2f} at 2,441 rows, k = 3, but {"
        + gain(
            "c9.results.where(method='dflash', prompt_set='heldout').acceptance_length",
            "d.prediction.eal",
        )
        + "|.2f} at 9,886 rows, k = 15",
    ),
    c(
        SPEED_BLOCKS,
        "(positions 4–15 under {hi([p for x in f.rows if x['method'] == 'dflash' for p in "
        "x.per_position.value[3:]]) * 100 + 0.5|.0f}% of steps)",
    ),
    c(
        {"b": SPEED_BLOCKS, "a": SPEED_2441},
        "(HumanEval outputs ≠ baseline: "
        + differing("b", "dflash")
        + " of 40 at k = 15, "
        + differing("b", "dflash_b8")
        + " at block 8, "
        + differing("a", "eagle3")
        + " with EAGLE-3)",
    ),
    c(
        "methods/methods_cpu.json",
        "(τ < 1.1; validation accuracy {f.training.dflash.best_validation.accuracy|.2f} a "
        "position)",
    ),
]

METHODS_ROUNDS = "gpu_runs/gpu-methods-rounds/"


def methods_rounds_row(label: str, method: str, verdict1: str, verdict8: str) -> str:
    one = f"f.results.where(method={method!r}, concurrency=1)"
    eight = f"f.results.where(method={method!r}, concurrency=8)"
    return (
        f"| {label} | {{{one}.acceptance_length|.2f}} | {{spread({one}.speedup_rounds)|.2f×}}, "
        f"{verdict1} | {{{one}.tokens_per_s|,.0f}} / {{{one}.baseline_tokens_per_s|,.0f}} | "
        f"{{spread({eight}.speedup_rounds)|.2f×}}, {verdict8} | {{{eight}.tokens_per_s|,.0f}} / "
        f"{{{eight}.baseline_tokens_per_s|,.0f}} | {{{one}.outputs_vs_baseline.differing}} / "
        f"{{{eight}.outputs_vs_baseline.differing}} of 80 |"
    )


EAGLE_PREDICTED = (
    "(1 + e.prediction.cond_acc[0] + e.prediction.cond_acc[0] * e.prediction.cond_acc[1] + "
    "e.prediction.cond_acc[0] * e.prediction.cond_acc[1] * e.prediction.cond_acc[2])"
)
ROUNDS_FILES = {
    "f": f"{METHODS_ROUNDS}h200_methods_speed_rounds.json",
    "e": f"{METHODS_ROUNDS}drafter/eagle3/metrics.json",
    "d": f"{METHODS_ROUNDS}drafter/dflash_b8/metrics.json",
    "p": f"{METHODS_ROUNDS}prepare/stats.json",
    "t": f"{METHODS_ROUNDS}prompts/train.stats.json",
    "cpu": "methods/gpu-methods-rounds_cpu_tau.json",
}
METHODS_IN_ROUNDS = [
    c(
        ROUNDS_FILES,
        "H200: {p.rows_kept} rows ({p.tokens_total / 1e6|.2f}M tokens, fp8) of {t.output.rows} "
        "ShareGPT turns; EAGLE-3 (predicted τ {" + EAGLE_PREDICTED + "|.2f}) and DFlash at block 8 "
        "(`eal` {d.prediction.eal|.2f}), 3 epochs.",
    ),
    c(ROUNDS_FILES, methods_rounds_row("EAGLE-3, k=3", "eagle3", "slower", "within noise")),
    c(ROUNDS_FILES, methods_rounds_row("DFlash block 8, k=7", "dflash", "slower", "slower")),
    c(
        ROUNDS_FILES,
        "The one baseline ran at {f.results.where(method='eagle3', concurrency=1)"
        ".baseline_tokens_per_s|.0f} tok/s beside EAGLE-3 and {f.results.where(method='dflash', "
        "concurrency=1).baseline_tokens_per_s|.0f} beside DFlash",
    ),
    c(
        ROUNDS_FILES,
        "**Both are served as trained**: "
        "{(f.results.where(method='eagle3', concurrency=1).acceptance_length - 1) / "
        "(" + EAGLE_PREDICTED + " - 1)|.2f} (EAGLE-3) and "
        "{(f.results.where(method='dflash', concurrency=1).acceptance_length - 1) / "
        "(d.prediction.eal - 1)|.2f} (DFlash) of the predicted gain on MT-Bench. On the 2-core CPU "
        "(float32 target, c = 8, one pass) they give MT-Bench τ "
        "{cpu.results.where(method='eagle3', prompt_set='mtbench').acceptance_length|.2f} and "
        "{cpu.results.where(method='dflash', prompt_set='mtbench').acceptance_length|.2f}, "
        "held-out "
        "(80) {cpu.results.where(method='eagle3', prompt_set='heldout').acceptance_length|.2f} and "
        "{cpu.results.where(method='dflash', prompt_set='heldout').acceptance_length|.2f}",
    ),
]

REPLICAS = {
    "r4": "scale_out/h200_synth_replicas_4servers_rounds.json",
    "r2": "scale_out/h200_synth_replicas_2servers_rounds.json",
}


def busy_cores(alias: str) -> str:
    """Cores busy in each round of a rounds benchmark, from the machine's CPU ticks."""
    return (
        f"[(b.after.cpu_ticks.busy - a.cpu_ticks.busy) / (b.after.cpu_ticks.total - "
        f"a.cpu_ticks.total) * 16 for a, b in zip([{alias}.surroundings_servers_up] + "
        f"[r.after for r in {alias}.rounds][:-1], {alias}.rounds)]"
    )


SCALE_OUT = [
    c(
        "scale_out/synth_split_cpu.json",
        "the same merged bytes in all {len(f.rounds) * 2} runs; "
        "{f.spread.one.median|.1f} s ({f.spread.one.min|.1f}–{f.spread.one.max|.1f}) against "
        "{f.spread.split.median|.1f} s ({f.spread.split.min|.1f}–{f.spread.split.max|.1f}), "
        "{f.ratio_split_over_one.median|.2f}× ({f.ratio_split_over_one.min|.2f}–"
        "{f.ratio_split_over_one.max|.2f})",
    ),
    c(
        REPLICAS,
        "One server {r4.spread.single.median|,.0f} tok/s ({r4.spread.single.min|,.0f}–"
        "{r4.spread.single.max|,.0f}), **4 servers {r4.spread.replicas.median|,.0f} "
        "({r4.spread.replicas.min|,.0f}–{r4.spread.replicas.max|,.0f}): "
        "{spread(r4.ratio_per_round)|.2f×}**; in the 2-server run "
        "{r2.spread.single.median|,.0f} against {r2.spread.replicas.median|,.0f}: "
        "{spread(r2.ratio_per_round)|.2f×}. Each server is paced by its engine loop on one core "
        "({median(" + busy_cores("r4") + ")|.0f} of 16 cores busy; a 135M step is mostly fixed "
        "CPU work), so 2 nearly double the rate; at 4 each keeps "
        "{r4.ratio.median / r4.servers|.2f} of one server's rate",
    ),
    c(
        REPLICAS,
        "the same token ids as its first for "
        "{span([x['fraction'] * 100 for r in (r4, r2) for x in "
        "r.identical_answers.single_rounds_vs_first])|.0f}% of the prompts, the replicas' passes "
        "{span([x['fraction'] * 100 for r in (r4, r2) for x in "
        "r.identical_answers.replicas_rounds_vs_single_first])|.0f}%",
    ),
]

RERUN_LOG = "reruns/rerun_costs.log"


def rerun(label: str) -> str:
    return f"f.match({label!r} + ': ([0-9]+) s')"


RERUNS = [
    c(
        {"f": RERUN_LOG, "r": "default_run/full_run_e8cdefe.json"},
        "a finished default run ({r.wall_s|,.0f} s, `default_run/full_run_e8cdefe.json`)",
    ),
    c(
        RERUN_LOG,
        "| nothing, or every operational key | none | {" + rerun("nothing changed") + "} s | 0 |",
    ),
    c(
        RERUN_LOG,
        "| {"
        + rerun("add a benchmark prompt set [(]a file[)]")
        + "} s; {"
        + rerun("edit the benchmark prompt file")
        + "} s | 2 |",
    ),
    c(RERUN_LOG, "| {" + rerun("remove a benchmark prompt set") + "} s | 0 |"),
    c(RERUN_LOG, "| {" + rerun("edit a benchmark set [(]mtbench n 8 -> 6[)]") + "} s | 2 |"),
    c(RERUN_LOG, "| {" + rerun("bench.max_tokens 96 -> 64") + "} s | 2 |"),
    c(
        RERUN_LOG,
        "| {"
        + rerun("add a training prompt file [(]8 prompts[)]")
        + "} s; {"
        + rerun("edit the training prompt file [(]2 of 8 prompts[)]")
        + "} s | 4 |",
    ),
    c(RERUN_LOG, "| {" + rerun("vocab.draft_vocab_size 8192 -> 4096") + "} s | 1 |"),
    # the large target's costs are those of Kimi-K2.5's plan, which tests/test_plan.py holds to
    # what the code prints
    c(
        "docs/plan.md",
        "for 10K prompts (a model load at least {f.match('model load +>= ([0-9]+) min')} min; "
        "synth ≥ {f.match('synth +1 +8 +8 +>= ([0-9.]+) h')} h, extraction ≥ "
        "{f.match('extract +1 +8 +8 +>= ([0-9]+) min')} min, training ≥ "
        "{f.match('train +1 +8 +8 +>= ([0-9]+) min')} min)",
    ),
]

ONLINE_RUN = "gpu_runs/online-rounds/gpu-online-rounds/"
H100 = "online/h100_online_vs_stored_rounds.json"
H100_TAU = "online/h100_online_vs_stored_tau.json"


def log_time(event: str) -> str:
    """The clock time of a speculators log line."""
    return f"clock(f.match('(..:..:..) INFO speculators: {event}'))"


def online_tau(alias: str, which: str) -> str:
    return " / ".join(
        f"{{{alias}.results.where(drafter='/tmp/w/online_drafters/{which}', prompt_set={s!r})"
        ".acceptance_length|.3f}"
        for s in SETS
    )


ONLINE = [
    c(
        "online/online_vs_stored.json",
        "τ equal to the last digit ("
        + " / ".join(f"{{f.online.acceptance_length.{s}|.3f}}" for s in SETS)
        + " at k = 3, T = 0), disk at most {f.online.disk_high_water_bytes / 1e6|.1f} MB online, "
        "{f.stored.disk_high_water_bytes / 1e6|.1f} MB stored",
    ),
    c(
        "online/online_vs_stored_rounds_cpu.json",
        "{spread([r.stored.train_s for r in f.training_rounds.rounds])|.1f s} stored, "
        "{spread([r.online.train_s for r in f.training_rounds.rounds])|.1f s} online,"
        " {spread(f.training_rounds.train_s_ratio_online_to_stored.per_round)|.2f×}.",
    ),
    c(
        {"h": H100, "p": f"{ONLINE_RUN}prepare/stats.json", "s": f"{ONLINE_RUN}synth/stats.json"},
        "{p.rows_kept} rows ({p.tokens_total / 1e6|.2f}M tokens)",
    ),
    c(
        {"s": f"{ONLINE_RUN}synth/stats.json"},
        "`synth/stats.json`: `context: {s.provenance.params.context}`",
    ),
    c(
        H100,
        "**Train job {spread([r.stored.train_s for r in f.training_rounds.rounds])|.1f s} stored, "
        "{spread([r.online.train_s for r in f.training_rounds.rounds])|.1f s} online, "
        "{spread(f.training_rounds.train_s_ratio_online_to_stored.per_round)|.2f×}**; the "
        "{f.training_rounds.rounds[0].stored.train_s|.0f} s was the machine's first training",
    ),
    c(
        {"h": H100, "t": H100_TAU},
        "**Disk {h.training_rounds.disk_high_water_bytes.stored.median / 1e9|.2f} GB stored, "
        "{h.training_rounds.disk_high_water_bytes.online.min / 1e6|.0f}–"
        "{h.training_rounds.disk_high_water_bytes.online.max / 1e6|.0f} MB online.** τ of the "
        "last round's drafters (k = 3, T = 0, 80 prompts a set) "
        + online_tau("t", "stored")
        + " stored, "
        + online_tau("t", "online")
        + " online, inside the [levers' spread](#what-moved-τ-the-levers-one-at-a-time). "
        "Online, the trainer waited on samples in "
        "{span([r.online.loader_wait_fraction * 100 for r in h.training_rounds.rounds])|.0f}% "
        "of its steps;",
    ),
    c(
        {"f": f"{ONLINE_RUN}logs/train_eagle3.log", "p": f"{ONLINE_RUN}prepare/stats.json"},
        "the last online round's epoch and validation took "
        "{"
        + log_time("Validation epoch 1/1 completed")
        + " - "
        + log_time("Training epoch 1/1 started")
        + "} s for the {p.rows_kept} rows, "
        "{p.rows_kept / ("
        + log_time("Validation epoch 1/1 completed")
        + " - "
        + log_time("Training epoch 1/1 started")
        + ")|.0f} rows/s (its `logs/train_eagle3.log`): an epoch of all 19,131 rows would take "
        "about {19131 / (p.rows_kept / ("
        + log_time("Validation epoch 1/1 completed")
        + " - "
        + log_time("Training epoch 1/1 started")
        + ")) / 60|.0f} minutes",
    ),
    c(
        f"{RUN_19K}logs/train_eagle3.log",
        "where the 19,131-row run's stored epochs 2–3 took "
        "{"
        + log_time("Validation epoch 2/3 completed")
        + " - "
        + log_time("Training epoch 2/3 started")
        + "}–{"
        + log_time("Validation epoch 3/3 completed")
        + " - "
        + log_time("Training epoch 3/3 started")
        + "} s with their validation",
    ),
]

OTHER_CHECKS = [
    c(
        {"f": "gate/ci_memorized_floor.json"},
        "three training seeds give τ {span([f.seeds[s].runs.where(prompt_set='memorized')"
        ".acceptance_length for s in f.seeds.value])|.3f} at k = 2 on the memorized set; the CI "
        "config's floors lie {f.margin * 100|.0f}% of the worst seed's gain below it",
    ),
    c(
        "thinking_cpu/summary.json",
        "the template check passes all {f.template_check.checked - f.template_check.mismatches} "
        "answers, the re-render check it replaced would flag all "
        "{f.checks_compared.rerender_check.text}",
    ),
    c(
        "gpu_runs/kimi-miniature-h100/bench/eagle3/metrics.json",
        "held-out τ {f.runs.where(prompt_set='heldout', k=3, temperature=0.0).acceptance_length"
        "|.2f}, predicted {f.runs.where(prompt_set='heldout').predicted_acceptance_length|.2f}",
    ),
    c(
        "gpu_runs/kimi-miniature-w4a16-h100/mla_extraction.json",
        "every layer it captured lies "
        "{span(f.rel_error_vs_transformers_fp32.value.values())|.3f} from the float32 "
        "forward",
    ),
    c(
        W4A16_BENCH,
        "measured τ {f.runs.where(prompt_set='mtbench').acceptance_length|.2f} on MT-Bench and "
        "{f.runs.where(prompt_set='heldout').acceptance_length|.2f} held-out, predicted "
        "{f.runs.where(prompt_set='heldout').predicted_acceptance_length|.2f}, and slows this "
        f"8-layer target ({W4A16_SPEEDUPS}× over {{f.rounds}} rounds)",
    ),
]

W4A16_RUN = "gpu_runs/kimi-miniature-w4a16-h100-drafter/"
MINIATURE_W4A16 = [
    Claim(
        "docs/miniature.md",
        {
            "t": W4A16_RUN + "drafter/metrics.json",
            "f": W4A16_RUN + "bench/eagle3/metrics.json",
        },
        "the best the last (validation loss {t.epochs[0].val.loss|.2f} to "
        "{t.epochs[t.best_epoch].val.loss|.2f}); at k = 3, T = 0, concurrency 1, τ "
        "{f.runs.where(prompt_set='mtbench').acceptance_length|.2f} on MT-Bench, "
        "{f.runs.where(prompt_set='humaneval').acceptance_length|.2f} on HumanEval and "
        "{f.runs.where(prompt_set='heldout').acceptance_length|.2f} on the held-out set, predicted "
        "{f.runs.where(prompt_set='heldout').predicted_acceptance_length|.2f} from training",
    ),
    Claim(
        "docs/miniature.md",
        W4A16_RUN + "bench/eagle3/metrics.json",
        f"this 8-layer target slower, {W4A16_SPEEDUPS}× over {{f.rounds}} alternating rounds",
    ),
    Claim(
        "docs/miniature.md",
        W4A16_RUN + "extract_bf16_rounds.json",
        "{f.tokens|,} tokens, {len(f.rounds.value)} alternating rounds",
    ),
    Claim(
        "docs/miniature.md",
        W4A16_RUN + "extract_bf16_rounds.json",
        "extraction runs at {f.ratio_per_round.min|.2f}–{f.ratio_per_round.max|.2f}× the bare "
        "prefill's token rate (median of per-round ratios {f.ratio_per_round.median|.2f})",
    ),
]


def outcome(kind: str) -> str:
    return "{f.outcomes[" + repr(kind).replace("'", '"') + "]}"


def total(prefix: str) -> str:
    return "{sum(v for k, v in f.outcomes.value.items() if k.startswith(" + repr(prefix) + "))}"


REFUSED_FILE = "prompt file: refused, naming the file: "
CONFIG_FILE = "config file: refused, naming the file: "
BAD_INPUT = [
    c(
        "checks/bad_input.json",
        "{f.tests_passed} tests pass, three generated by hypothesis (derandomized): "
        "{f.generated_cases} bad inputs in {f.seconds|.0f} s on 2 shared cores, none ending in "
        "another exception or changing a file. Prompt files: "
        + outcome("prompt file: read; bad rows skipped and counted")
        + " read with bad rows skipped and counted, "
        + outcome("prompt file: read")
        + " read whole, "
        + total(REFUSED_FILE)
        + " refused naming the file ("
        + outcome(REFUSED_FILE + "corrupt or truncated")
        + " corrupt or truncated, "
        + outcome(REFUSED_FILE + "no rows")
        + " no rows, "
        + outcome(REFUSED_FILE + "no usable row")
        + " no usable row). Configs with wrong values: "
        + outcome("config values: refused, naming the key")
        + " refused naming every wrong key, "
        + outcome("config values: valid: accepted")
        + " valid. Damaged config files: "
        + total(CONFIG_FILE)
        + " refused naming file and line ("
        + outcome(CONFIG_FILE + "a key given twice, with both lines")
        + " a key twice, "
        + outcome(CONFIG_FILE + "not UTF-8 text")
        + " not UTF-8, "
        + outcome(CONFIG_FILE + "not YAML, with its line")
        + " not YAML), "
        + outcome("config file: refused, naming the key")
        + " naming the key, "
        + outcome("config file: valid: accepted")
        + " valid.",
    )
]

TENSOR_PARALLEL_SUMMARY = [
    c(
        "tensor_parallel/compare_tp1_tp3.json",
        "extraction at TP=3 equals TP=1 within a relative error of "
        "{hi(f.rel_error_max_per_layer.value.values())|.1e} per layer, next-token agreement "
        "{f.next_token_agreement_a * 100|.3f}% at both",
    ),
    c(
        "scale_out/slurm_ci_run.json",
        "all {len([j for j in f.jobs if j['state'] == 'COMPLETED'])} jobs COMPLETED in `sacct`, "
        "training on {f.jobs.where(rule='train').nodes} nodes",
    ),
]

CROSS_REFERENCES = [
    c(
        {
            "r": "gpu_runs/gpu-rounds/bench/eagle3/metrics.json",
            "m": f"{METHODS_ROUNDS}h200_methods_speed_rounds.json",
            "g": "gpu_runs/quality-speed/h200_quality_speed_t0.json",
        },
        "loses here at τ {r.runs.where(prompt_set='mtbench', concurrency=1).acceptance_length|.1f} "
        "({r.runs.where(prompt_set='mtbench', concurrency=1).speedup|.2f}×) and "
        "{m.results.where(method='eagle3', concurrency=1).acceptance_length|.2f} "
        "({m.results.where(method='eagle3', concurrency=1).speedup|.2f}×) and gains from τ "
        "{g.results.where(prompt_set='mtbench', concurrency=1).acceptance_length|.2f} "
        "({g.results.where(prompt_set='mtbench', concurrency=1).speedup|.2f}×, every round "
        "{span(g.results.where(prompt_set='mtbench', concurrency=1).speedup_rounds)|.2f}:",
    ),
]
CROSS_REFERENCES.append(
    c(
        "methods/gpu-methods-blocks_cpu_replay.json",
        "within {max([abs(x.served - x.replay) for x in f.table]) + 0.0005|.3f} of τ for the "
        "H200's DFlash drafters",
    )
)

BESIDE = "f.summary['train, beside 2 busy processes'].passive_to_default_per_round"
THREADS = [
    c(
        "tests/cpu_openmp_wait.json",
        f"beside two busy processes {{span({BESIDE}.wall_s.value)|.2f}}× the wall time and "
        f"{{span({BESIDE}.cpu_s.value)|.2f}}× the CPU seconds of the library default, alone "
        "{span(f.summary['train, alone'].passive_to_default_per_round.wall_s.value)|.2f}× the wall "
        "time; a CPU server's four answers took "
        "{span(f.summary['serve, alone'].passive_to_default_per_round.wall_s.value)|.2f}× as long "
        "alone",
    )
]

ENGINE = "f.by_kind['vLLM engine core']"
CENSUS = [
    c(
        "tests/cpu_by_process_full.json",
        "of {f.accounted_cpu_s|,.0f} CPU seconds counted, vLLM's engine cores "
        f"{{{ENGINE}.cpu_s|,.0f}} ({{100 * {ENGINE}.share|.0f}}%, {{{ENGINE}.processes}} "
        "processes) and API servers {f.by_kind['vLLM API server'].cpu_s|.0f}, trainings "
        "{f.by_kind.training.cpu_s|.0f}, Snakemake's job scripts "
        "{f.by_kind['Snakemake job script'].cpu_s|.0f} and dry runs "
        "{f.by_kind['Snakemake dry run'].cpu_s|.0f}, the miniature's build "
        '{f.by_kind["the miniature\'s build"].cpu_s|.0f}; the machine idled '
        "{100 * lo(f.idle_share_by_minute.value[29:38])|.0f}–"
        "{100 * hi(f.idle_share_by_minute.value[29:38])|.0f}% of each of the run's last 9 minutes",
    )
]
