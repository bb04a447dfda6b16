"""The figures of README.md's Results table (tests/figures.py says how a claim reads)."""

from __future__ import annotations

from figures import Claim

PAGE = "README.md"


def c(files, text: str) -> Claim:
    return Claim(PAGE, files, text)


CPU_RUN = "default_run/bench_eagle3_46463ef.json"
ALL = "quality_vs_data/tau_vs_data_all.json"
SPEED_T0 = "gpu_runs/quality-speed/h200_quality_speed_t0.json"
SPEED_T1 = "gpu_runs/quality-speed/h200_quality_speed_t1.json"
ROUNDS = "gpu_runs/gpu-rounds/bench/eagle3/metrics.json"
SYNTH = [
    "efficiency/h200_synth_throughput_repeat1_rounds.json",
    "efficiency/h200_synth_throughput_repeat2_rounds.json",
    "efficiency/h200_synth_throughput_client_rounds.json",
]


def point(samples: int, prompt_set: str, measured_on: str = "H200") -> str:
    return (
        f"a.points.where(samples={samples}, measured_on={measured_on!r}, temperature=0.0, "
        f"prompt_set={prompt_set!r}).tau"
    )


README = [
    c(
        CPU_RUN,
        "160 samples on a 2-core CPU in {f.dag_wall_s / 60|.0f} minutes: τ "
        "{f.acceptance_length.mtbench|.2f} on MT-Bench at k = 3 (predicted "
        "{f.metrics.runs[0].predicted_acceptance_length|.2f}), every check green; speedup "
        "{span([r.speedup for r in f.metrics.runs])|.2f}× in one pass a set",
    ),
    c(
        {
            "a": ALL,
            "g": "quality_vs_data/h200_quality_t0_tau.json",
            "s": "quality_vs_data/h200_quality_t1_tau.json",
        },
        "τ at k = 3, T = 0 grows with the data: {" + point(80, "mtbench", "CPU") + "|.2f} at 80 "
        "samples, {" + point(636, "mtbench", "CPU") + "|.2f} at 636 (CPU), "
        "{" + point(9886, "mtbench") + "|.2f} at 9,886 and {" + point(19131, "mtbench") + "|.2f}"
        " on MT-Bench, {" + point(19131, "heldout", "CPU") + "|.2f} held-out at the packaged "
        "data's limit of 19,131 (H200-trained); τ 2.5 would need about 50,000. At T = 1, "
        "{span([r.acceptance_length for x in (g, s) for r in x.results "
        "if r['temperature'] == 1.0])|.2f}",
    ),
    c(
        {"g": SPEED_T0, "s": SPEED_T1, "r": ROUNDS},
        "the largest-data drafter (τ {span([x.acceptance_length for x in g.results])|.1f}) is "
        "faster even on the 135M target, "
        "{span([x.speedup for x in g.results if x['concurrency'] == 1])|.2f}× at concurrency 1 "
        "and {span([x.speedup for x in g.results if x['concurrency'] == 8])|.2f}× at 8 (every "
        "round faster in {len([x for x in g.results if lo(x.speedup_rounds) > 1])} of "
        "{len(g.results)} settings); at T = 1 {span([x.speedup for x in s.results])|.2f}×; a "
        "160-sample drafter (τ {median([x.acceptance_length for x in r.runs])|.1f}) "
        "{span([x.speedup for x in r.runs])|.2f}×",
    ),
    c(
        "efficiency/h200_step_costs_quality_drafter_t0.json",
        "an EAGLE-3 step costs {f.projections['llama-8b'].vllm_spec_step.break_even_tau|.2f} "
        "target steps, so the largest-data drafter's τ would give "
        "{span(f.projections['llama-8b'].vllm_spec_step.speedup.value.values())|.2f}× at T = 0",
    ),
    c(
        {
            "s1": SYNTH[0],
            "s2": SYNTH[1],
            "s3": SYNTH[2],
            "e8": "efficiency/h200_extract_throughput_8b_waitthreads_rounds.json",
            "w": "efficiency/h200_extract_throughput_8b_wait_rounds.json",
            "fp8": "efficiency/h200_extract_throughput_8b_fp8_sidestream_rounds.json",
        },
        "synth client ÷ bare client {median([r.pipeline.tokens_per_s / r.bare.tokens_per_s "
        "for x in (s1, s2, s3) for r in x.rounds])|.2f} (median of nine rounds; goal 0.95); "
        "extraction ÷ bare prefill {span([x.ratio_per_round.median for x in (e8, w)])|.2f} at "
        "the Llama-3.1-8B shape in bf16, {fp8.ratio_per_round.median|.2f} in fp8 (goal 0.90), "
        "medians of the per-round ratios: vLLM's capture alone leaves "
        "{span([median([r.minimal.tokens_per_s / r.bare.tokens_per_s for r in x.rounds]) "
        "for x in (e8, w)])|.2f}, the client keeps "
        "{span([median([r.extract.tokens_per_s / r.minimal.tokens_per_s for r in x.rounds]) "
        "for x in (e8, w, fp8)])|.2f} of that",
    ),
    c(
        {
            "a": "gpu_runs/gpu-methods-2500/h200_drafter_speed.json",
            "c": "methods/gpu-methods_cpu_tau.json",
            "m": "gpu_runs/gpu-methods-rounds/h200_methods_speed_rounds.json",
        },
        "EAGLE-3's τ ahead at every size "
        "({a.rows.where(method='eagle3', prompt_set='mtbench').acceptance_length|.2f} against "
        "{a.rows.where(method='dflash', prompt_set='mtbench').acceptance_length|.2f} at 2,441 "
        "rows, {c.results.where(method='eagle3', prompt_set='mtbench').acceptance_length|.2f} "
        "against {c.results.where(method='dflash', prompt_set='mtbench').acceptance_length|.2f} "
        "at 9,886); in 3 alternating rounds on an H200 neither speeds up the 135M target and the "
        "two cannot be told apart "
        "({spread(m.results.where(method='eagle3', concurrency=1).speedup_rounds)|.2f×} and "
        "{spread(m.results.where(method='dflash', concurrency=1).speedup_rounds)|.2f×})",
    ),
    c(
        "tensor_parallel/compare_tp1_tp3.json",
        "TP=3 extraction equals TP=1 within {hi(f.rel_error_max_per_layer.value.values())|.0e}",
    ),
    c(
        {
            "s": "scale_out/synth_split_cpu.json",
            "l": "scale_out/slurm_ci_run.json",
            "r": "scale_out/h200_synth_replicas_4servers_rounds.json",
        },
        "on one 2-core machine the parts run one after the other "
        "({s.ratio_split_over_one.median|.2f}× the time); the CI DAG through a real Slurm "
        "cluster: {len(l.jobs)} Slurm jobs completed, training on "
        "{l.jobs.where(rule='train').nodes} nodes; 4 synth servers sharing one H200 answer "
        "{spread(r.ratio_per_round)|.2f×} as fast as one",
    ),
    c(
        "reruns/rerun_costs.log",
        "a removed benchmark set: {f.match('remove a benchmark prompt set: ([0-9]+) s')} s, no "
        "server",
    ),
]
