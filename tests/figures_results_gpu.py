"""The figures of docs/results.md on speed on a GPU, step costs and engine efficiency, with the
files they come from (tests/figures.py says how a claim reads)."""

from __future__ import annotations

from figures import Claim
from figures_results_data import SETS

PAGE = "docs/results.md"


def c(files, text: str) -> Claim:
    return Claim(PAGE, files, text)


SPEED_T0 = "gpu_runs/quality-speed/h200_quality_speed_t0.json"
SPEED_T1 = "gpu_runs/quality-speed/h200_quality_speed_t1.json"


def run(alias: str, prompt_set: str, concurrency: int, key: str = "results") -> str:
    return f"{alias}.{key}.where(prompt_set={prompt_set!r}, concurrency={concurrency})"


def timed(at: str, bold: bool = False, verdict: str = "") -> str:
    """``tok/s with (spread) / without (spread) | speedup (spread)`` of one bench run."""
    b = "**" if bold else ""
    return (
        f"{{spread({at}.tokens_per_s_rounds)|,.0f}} / "
        f"{{spread({at}.baseline_tokens_per_s_rounds)|,.0f}} | "
        f"{b}{{spread({at}.speedup_rounds)|.2f×}}{verdict}{b}"
    )


def speed_row(prompt_set: str, t: int, bold1: bool, bold8: bool, tau_c8: bool = False) -> str:
    """A row of the largest-data drafter's speed table (file ``g``): τ, then each concurrency's
    tok/s with and without and speedup; outputs that differ from the baseline's at T = 0."""
    one, eight = run("g", prompt_set, 1), run("g", prompt_set, 8)
    tau_text = f"{{{one}.acceptance_length|.2f}}"
    if tau_c8:
        tau_text += f" (c = 8: {{{eight}.acceptance_length|.2f}})"
    verdict = ", within noise" if not bold1 and t == 0 else ""
    differ = (
        f"{{{one}.outputs_vs_baseline.differing}} / {{{eight}.outputs_vs_baseline.differing}} of 80"
        if t == 0
        else "—"
    )
    return (
        f"| {SETS[prompt_set]} | {t} | {tau_text} | {timed(one, bold1, verdict)} | "
        f"{timed(eight, bold8)} | {differ} |"
    )


def step_cost(alias: str, concurrency: int | None = None) -> str:
    """τ × tok/s without ÷ with, over a file's runs (at one concurrency)."""
    cond = "" if concurrency is None else f" if x['concurrency'] == {concurrency}"
    return (
        f"{{span([x.acceptance_length * x.baseline_tokens_per_s / x.tokens_per_s "
        f"for x in {alias}.results{cond}])|.2f}}"
    )


QUALITY_SPEED = [
    *[
        c({"g": SPEED_T0 if t == 0 else SPEED_T1}, speed_row(s, t, *bold, tau_c8=tau_c8))
        for s, t, bold, tau_c8 in [
            ("mtbench", 0, (True, True), False),
            ("humaneval", 0, (True, True), False),
            ("heldout", 0, (False, True), False),
            ("mtbench", 1, (False, False), False),
            ("humaneval", 1, (False, False), True),
            ("heldout", 1, (False, False), False),
        ]
    ],
    c(
        {"g": SPEED_T0, "s": SPEED_T1},
        "faster, {span([x.speedup for x in g.results if x['concurrency'] == 1])|.2f}× at "
        "concurrency 1 and {span([x.speedup for x in g.results if x['concurrency'] == 8])|.2f}× "
        "at 8; on the held-out set at concurrency 1 one round of three was slower (within noise). "
        "**At T = 1 every round is slower**: {span([x.speedup for x in s.results])|.2f}×.",
    ),
    c(
        {"g": SPEED_T0, "s": SPEED_T1},
        "costs "
        + step_cost("g", 1)
        + " plain steps at concurrency 1, "
        + step_cost("g", 8)
        + " at 8 (T = 0), "
        + step_cost("s")
        + " at T = 1",
    ),
    c(
        {"g": SPEED_T0},
        "this baseline ran at {" + run("g", "mtbench", 1) + ".baseline_tokens_per_s|.0f} tok/s "
        "(MT-Bench, c = 1)",
    ),
]

ROUNDS = "gpu_runs/gpu-rounds/"


def rounds_job(name: str) -> dict[str, str]:
    return {name: f"{ROUNDS}benchmarks/{name}.tsv"}


def rounds_row(prompt_set: str) -> str:
    one, eight = run("m", prompt_set, 1, "runs"), run("m", prompt_set, 8, "runs")
    return (
        f"| {SETS[prompt_set]} | {{{one}.acceptance_length|.2f}} "
        f"({{{one}.predicted_acceptance_length|.2f}}) | "
        + " / ".join(f"{{{one}.per_position[{i}]|.3f}}" for i in range(3))
        + f" | {timed(one)} | {timed(eight)} | {{{one}.outputs_vs_baseline.differing}} / "
        f"{{{eight}.outputs_vs_baseline.differing}} of 80 |"
    )


DEFAULT_GPU = [
    c(
        {
            "p": f"{ROUNDS}prompts/train.stats.json",
            "s": f"{ROUNDS}synth/stats.json",
            "r": f"{ROUNDS}prepare/stats.json",
            "log": f"{ROUNDS}host/smoke.log",
            "b": f"{ROUNDS}logs/bench_eagle3.log",
            **rounds_job("target"),
            **rounds_job("synth"),
            **rounds_job("extract_part0"),
            **rounds_job("train_eagle3"),
            **rounds_job("bench_eagle3"),
        },
        "on an H200: {p.totals.sampled} ShareGPT prompts ({p.totals.heldout} held out as "
        "`heldout`), {s.samples_ok} answered, {r.rows_kept} training rows; EAGLE-3, k = 3, T = 0, "
        "96 tokens; sets of 80 prompts; 3 rounds per setting. The DAG took "
        "{(clock(log.match('(..:..:..) 2026.\\nFinished jobid: 0 ')) - "
        "clock(log.match('Date: [^ ]+ ([^ ]+)'))) // 60} min "
        "{(clock(log.match('(..:..:..) 2026.\\nFinished jobid: 0 ')) - "
        "clock(log.match('Date: [^ ]+ ([^ ]+)'))) % 60} s (target {target.s|.0f} s, synth "
        "{synth.s|.0f} s, extract {extract_part0.s|.0f} s, train {train_eagle3.s|.0f} s, bench "
        "{bench_eagle3.s|.0f} s: two server starts of {b.match('ready after ([0-9]+) s')} and "
        "{b.match('(?s)ready after [0-9]+ s.*?ready after ([0-9]+) s')} s, then 36 "
        "passes).",
    ),
    *[c({"m": f"{ROUNDS}bench/eagle3/metrics.json"}, rounds_row(s)) for s in SETS],
]


def moved(field: str, concurrency: int) -> str:
    """The most a run's per-round figure moved (max ÷ min − 1, in %) at one concurrency."""
    return (
        f"{{max([hi(x.{field}) / lo(x.{field}) - 1 for x in m.runs "
        f"if x['concurrency'] == {concurrency}]) * 100|.0f}}%"
    )


DEFAULT_GPU_NOTES = [
    c(
        {"m": f"{ROUNDS}bench/eagle3/metrics.json"},
        "(τ 1.2; its step {span([x.acceptance_length * x.baseline_tokens_per_s / x.tokens_per_s "
        "for x in m.runs if x['concurrency'] == 1])|.2f} plain steps at concurrency 1, "
        "{span([x.acceptance_length * x.baseline_tokens_per_s / x.tokens_per_s for x in m.runs "
        "if x['concurrency'] == 8])|.2f} at 8) costs a 135M target "
        "{span([(1 - x.speedup) * 100 for x in m.runs if x['concurrency'] == 1])|.0f}% of its "
        "speed at concurrency 1. Between "
        "rounds the baseline's rate moved by up to "
        + moved("baseline_tokens_per_s_rounds", 1)
        + " at concurrency 1 and "
        + moved("baseline_tokens_per_s_rounds", 8)
        + " at 8, the paired ratios by up to "
        + moved("speedup_rounds", 1)
        + " and "
        + moved("speedup_rounds", 8)
        + ".",
    ),
]

STEPS = "efficiency/h200_step_costs.json"
STEPS_135M = "efficiency/h200_step_costs_135m.json"


def ms(at: str, spec: str = ".2f", how: str = "range") -> str:
    """A step time as the table writes it: median (min–max), or median (max …)."""
    if how == "max":
        return f"{{{at}.median|{spec}}} ms (max {{{at}.max|{spec}}})"
    return f"{{{at}.median|{spec}}} ms ({{{at}.min|{spec}}}–{{{at}.max|{spec}}})"


def shape_row(label: str, shape: str, how: str, spec_step: str) -> str:
    at = f"f.shapes['{shape}']"
    return (
        f"| {label} | {ms(at + '.target_step_ms', how=how)} | {ms(at + '.verify_step_ms')} | "
        f"{{{at}.drafter.layer_step_ms.median|.3f}} + {{{at}.drafter.fc_ms.median|.3f}} ms | "
        f"{spec_step} | {{{at}.engine_start_s|.0f}} s"
    )


def projected(alias: str, shape: str, way: str) -> str:
    return " / ".join(f"{{{alias}.projections['{shape}'].{way}.speedup.{s}|.2f}}×" for s in SETS)


def measured(alias: str) -> str:
    return " / ".join(
        f"{{{alias}.measured_135m_c1[{i}].speedup|.2f}}× "
        f"({{{alias}.measured_135m_c1[{i}].speedup_range|.2f}})"
        for i in range(3)
    )


def projection_row(alias: str, label: str, t: int) -> str:
    taus = " / ".join(f"{{{alias}.tau.{s}|.2f}}" for s in SETS)
    return (
        f"| {label} ({taus}) | {t} | {measured(alias)} | "
        f"{projected(alias, 'llama-8b', 'vllm_spec_step')} | "
        f"{projected(alias, 'llama-8b', 'components')} |"
    )


STEP_COSTS = [
    c(
        STEPS,
        shape_row(
            "Llama-3.1-8B",
            "llama-8b",
            "range",
            "{f.shapes['llama-8b'].spec_engine.spec_step_ms.median|.2f} ms "
            "({f.shapes['llama-8b'].spec_engine.spec_step_ms.min|.2f}–"
            "{f.shapes['llama-8b'].spec_engine.spec_step_ms.max|.2f})",
        )
        + " (with drafter {f.shapes['llama-8b'].spec_engine.engine_start_s|.0f} s) |",
    ),
    c(
        STEPS,
        shape_row("Kimi-K2, 1 MoE layer (61 in the model)", "kimi-k2-1l", "max", "not run") + " |",
    ),
    c(STEPS, shape_row("Kimi-K2, 2 MoE layers", "kimi-k2-2l", "max", "not run") + " |"),
    c(STEPS_135M, shape_row("SmolLM2-135M", "smollm2-135m", "range", "not run") + " |"),
    c(
        STEPS,
        "| drafter (τ) | T | 135M target, measured (3 rounds) | 8B shape, from vLLM's step "
        "(break-even τ {f.projections['llama-8b'].vllm_spec_step.break_even_tau|.2f}) | 8B "
        "shape, from the components ({f.projections['llama-8b'].components.break_even_tau|.2f}) |",
    ),
    c({"a": STEPS}, projection_row("a", "160 samples", 0)),
    c(
        {"a": "efficiency/h200_step_costs_quality_drafter_t0.json"},
        projection_row("a", "19,131 rows", 0),
    ),
    c(
        {"a": "efficiency/h200_step_costs_quality_drafter_t1.json"},
        projection_row("a", "19,131 rows", 1),
    ),
    c(
        {"f": STEPS, "s": STEPS_135M, "q": "efficiency/h200_step_costs_quality_drafter_t0.json"},
        "**At the 8B shape** an EAGLE-3 step costs "
        "{f.projections['llama-8b'].vllm_spec_step.break_even_tau|.2f} target steps: τ 1.2 would "
        "still lose narrowly, the 19,131-row drafter pay "
        "{span(q.projections['llama-8b'].vllm_spec_step.speedup.value.values())|.2f}× at T = 0. "
        "Use vLLM's own step: from the components the 160-sample drafter projects "
        "{span(s.projections['smollm2-135m'].components.speedup.value.values())|.2f}× at the 135M "
        "shape where {s.projections['smollm2-135m'].measured.mtbench|.2f}× was measured",
    ),
    c(
        STEPS,
        "The Kimi-K2 cuts (components: "
        "{span([f.projections[s].components.speedup[p] for s in ('kimi-k2-1l', 'kimi-k2-2l') "
        "for p in ('mtbench', 'humaneval', 'heldout')])|.2f}×) do not project Kimi-K2: one MoE "
        "layer more changed the step by "
        "{f.costs_ms['kimi-k2-2l'].t_target_ms - f.costs_ms['kimi-k2-1l'].t_target_ms|.2f} ms, "
        "below what 5 rounds resolve; a drafter step at its width (7,168) costs "
        "{f.costs_ms['kimi-k2-1l'].t_draft_ms|.2f} ms",
    ),
]


def per_round(alias: str, a: str, b: str) -> str:
    """The per-round ratios of variant ``a`` to ``b`` of a rounds benchmark."""
    return f"[r.{a}.tokens_per_s / r.{b}.tokens_per_s for r in {alias}.rounds]"


def rate(alias: str, name: str) -> str:
    """A rate's median (min–max) over the rounds."""
    at = f"{alias}.spread.{name}"
    return f"{{{at}.median|,.0f}} ({{{at}.min|,.0f}}–{{{at}.max|,.0f}})"


def ratio(spec: str) -> str:
    """The median of the per-round ratios, in bold, with their min–max."""
    at = "f.ratio_per_round"
    return f"**{{{at}.median|{spec}}}** ({{{at}.min|.2f}}–{{{at}.max|.2f}})"


def efficiency_row(label: str, name: str, kind: str) -> str:
    if kind == "synth":
        rates = f"{rate('f', 'pipeline')} | {rate('f', 'bare')}"
        ratios = ratio(".2f")
        capture = ""
    else:
        rates = f"{rate('f', 'extract')} | {rate('f', 'bare')}"
        ratios = ratio(".3f")
        capture = f"{{median({per_round('f', 'minimal', 'bare')})|.3f}}"
    return f"| {label} | {rates} | {ratios} | {capture} | `{name}` |"


EFFICIENCY_FILES = {
    "synth1": "efficiency/h200_synth_throughput_repeat1_rounds.json",
    "synth2": "efficiency/h200_synth_throughput_repeat2_rounds.json",
    "client": "efficiency/h200_synth_throughput_client_rounds.json",
    "e135": "efficiency/h200_extract_throughput_135m_waitthreads_rounds.json",
    "e8": "efficiency/h200_extract_throughput_8b_waitthreads_rounds.json",
    "wait": "efficiency/h200_extract_throughput_8b_wait_rounds.json",
    "fp8": "efficiency/h200_extract_throughput_8b_fp8_sidestream_rounds.json",
}
BF16_8B_RUNS = {
    "r1536": "efficiency/h200_extract_throughput_8b_1536_rounds.json",
    "switch": "efficiency/h200_extract_throughput_8b_switch_rounds.json",
    "cl": "efficiency/h200_extract_throughput_8b_client_rounds.json",
    "copyfree": "efficiency/h200_extract_throughput_8b_copyfree_rounds.json",
    "e8": EFFICIENCY_FILES["e8"],
    "wait": EFFICIENCY_FILES["wait"],
}


SYNTHS = "(synth1, synth2, client)"
SYNTH_RATIOS = (
    f"[r.pipeline.tokens_per_s / r.bare.tokens_per_s for n in {SYNTHS} for r in n.rounds]"
)
GPU_BUSY = (
    "[int(r.after.gpu_utilization[0]['utilization_pct']) for n in " + SYNTHS + " for r in n.rounds]"
)


EFFICIENCY = [
    *[
        c(
            EFFICIENCY_FILES[alias],
            efficiency_row(label, EFFICIENCY_FILES[alias].split("/")[1], kind),
        )
        for label, alias, kind in [
            ("synth ÷ bare client, 135M", "synth1", "synth"),
            ("the same, again", "synth2", "synth"),
            ("extraction ÷ bare prefill, 135M", "e135", "extract"),
            ("extraction ÷ bare prefill, 8B shape", "e8", "extract"),
            ("the same, again", "wait", "extract"),
            ("the same, fp8 storage", "fp8", "extract"),
        ]
    ],
    c(
        EFFICIENCY_FILES,
        "prefix caching off; no other GPU process, load average "
        "{span(loads(synth1, synth2, e135, e8, wait, fp8))|.1f}"
        " on 16 cores.",
    ),
    c(
        EFFICIENCY_FILES,
        "`h200_synth_throughput_client_rounds.json`, {client.ratio_per_round.median|.3f} "
        "({client.ratio_per_round.min|.2f}–{client.ratio_per_round.max|.2f})) the nine per-round "
        "ratios span "
        "{lo(" + SYNTH_RATIOS + ")|.3f}–{hi(" + SYNTH_RATIOS + ")|.2f}, median "
        "{median(" + SYNTH_RATIOS + ")|.2f}; the 135M server ({lo(" + GPU_BUSY + ")}–"
        "{hi(" + GPU_BUSY + ")}% of the GPU busy) is paced by its own CPU work. The client costs "
        "{span([n.client_cpu_ms_per_request_spread.pipeline.median for n in " + SYNTHS + "])|.2f}"
        " ms of CPU a request (bare: "
        "{span([n.client_cpu_ms_per_request_spread.bare.median for n in " + SYNTHS + "])|.2f}).",
    ),
    c(
        {**EFFICIENCY_FILES, **BF16_8B_RUNS},
        "reaches {span([median("
        + per_round("n", "minimal", "bare")
        + ") for n in (e8, wait)])|.3f} "
        "of bare prefill in bf16 ({span([median("
        + per_round("n", "minimal", "bare")
        + ") for n in "
        "(r1536, switch, cl, copyfree, e8, wait)])|.2f} in every bf16 8B run of 1,024 rows or "
        "more), {median(" + per_round("fp8", "minimal", "bare") + ")|.3f} in fp8, "
        "{median(" + per_round("e135", "minimal", "bare") + ")|.3f} at 135M; the client keeps "
        "{span([median(" + per_round("n", "extract", "minimal") + ") for n in (e8, wait)])|.3f} of "
        "it in bf16, {median(" + per_round("fp8", "extract", "minimal") + ")|.3f} in fp8, "
        "{median(" + per_round("e135", "extract", "minimal") + ")|.3f} at 135M, at "
        "{span([n.client_cpu_s_per_sample_spread.extract.median * 1000 for n in (e8, wait)])|.0f} "
        "ms of CPU a sample in bf16 and "
        "{fp8.client_cpu_s_per_sample_spread.extract.median * 1000|.1f} "
        "in fp8.",
    ),
]

GIL = "efficiency/gil_profile_8b_waitthreads.json"


def validator_work(alias: str) -> str:
    """Milliseconds of validator work a sample in each round (every phase but waiting)."""
    return (
        f"[sum([v for k, v in r.extract.validator_s_per_phase.value.items() if k != 'wait_write'])"
        f" / {alias}.args.rows * 1000 for r in {alias}.rounds]"
    )


def validator_busy(alias: str) -> str:
    """Validator threads busy in each round: work ÷ the round's extraction wall time."""
    return (
        f"[sum([v for k, v in r.extract.validator_s_per_phase.value.items() if k != 'wait_write'])"
        f" / ({alias}.tokens / r.extract.tokens_per_s) for r in {alias}.rounds]"
    )


GIL_LOCK = (
    "sum([v for k, v in g.lock_ms_per_request.value.items() if k not in "
    "('capture-only client', 'bare-prefill client')])"
)
GIL_RATE = "g.benchmark.median.extract / (g.benchmark.tokens / 1024)"
VALIDATOR = [
    c(
        {"e8": EFFICIENCY_FILES["e8"], "wait": EFFICIENCY_FILES["wait"], "g": GIL},
        "(" + "{span(" + validator_work("e8") + " + " + validator_work("wait") + ")|.0f}"
        " ms of work a sample over 8 threads, {span("
        + validator_busy("e8")
        + " + "
        + validator_busy("wait")
        + ")|.1f} busy, in bf16). A py-spy `--gil` profile "
        "(`lab/gil_profile.py`, 8B on 1,024 rows; that run {g.benchmark.ratio_per_round.median|.3f}"
        ") puts the interpreter lock at {" + GIL_LOCK + "|.1f} ms a sample, held "
        "{" + GIL_LOCK + " * " + GIL_RATE + " / 10|.0f}% of the time at {" + GIL_RATE + "|.0f} "
        "samples a second: validator threads "
        "{g.lock_ms_per_request['validator threads (read, parse, checks, hash, move)']|.2f}, the "
        "request {g.lock_ms_per_request['plain JSON request']|.2f}, aiohttp "
        '{g.lock_ms_per_request["HTTP transport callbacks (aiohttp), every client\'s"]|.2f}, the '
        "rest {" + GIL_LOCK + " - g.lock_ms_per_request['validator threads (read, parse, checks, "
        "hash, move)'] - g.lock_ms_per_request['plain JSON request'] - "
        'g.lock_ms_per_request["HTTP transport callbacks (aiohttp), every client\'s"]|.2f}',
    ),
]

NOTES = [
    c(
        {"g": SPEED_T0},
        "in {len([x for x in g.results if lo(x.speedup_rounds) > 1])} of {len(g.results)} "
        "settings every round is faster",
    ),
    c(
        {"g": SPEED_T0},
        "equal the baseline's at concurrency 1 but for "
        "{sum([x.outputs_vs_baseline.differing for x in g.results if x['concurrency'] == 1])} "
        "held-out answers (bfloat16 near-ties of the verify pass); batched bfloat16 is not "
        "batch-invariant ({span([x.outputs_vs_baseline.differing for x in g.results "
        "if x['concurrency'] == 8])}",
    ),
    c(
        {"r": f"{ROUNDS}bench/eagle3/metrics.json"},
        "the default DAG's below at "
        "{r.runs.where(prompt_set='mtbench', concurrency=1).baseline_tokens_per_s|.0f} on another "
        "H200 machine",
    ),
    c(
        STEPS,
        "({f.shapes['llama-8b'].spec_engine.accepted} of "
        "{f.shapes['llama-8b'].spec_engine.drafts} drafts accepted)",
    ),
    c(
        EFFICIENCY_FILES["e8"],
        "or ShareGPT rows ({f.tokens / 1e3|.0f}K tokens; extraction: c = {f.args.concurrency})",
    ),
]
