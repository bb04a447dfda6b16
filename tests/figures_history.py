"""The figures of docs/results_history.md (tests/figures.py says how a claim reads)."""

from __future__ import annotations

from figures import Claim

PAGE = "docs/results_history.md"


def c(files, text: str) -> Claim:
    return Claim(PAGE, files, text)


EFF = "efficiency/"
QUALITY = "gpu_runs/gpu-quality/"


def rate(alias: str, name: str) -> str:
    at = f"{alias}.spread.{name}"
    return f"{{{at}.median|,.0f}} ({{{at}.min|,.0f}}–{{{at}.max|,.0f}})"


def per_round(a: str, b: str) -> str:
    return f"[r.{a}.tokens_per_s / r.{b}.tokens_per_s for r in f.rounds]"


def earlier_row(label: str, file: str, synth: bool = False) -> Claim:
    if synth:
        rates, capture = f"{rate('f', 'pipeline')} | {rate('f', 'bare')}", ""
    else:
        rates = f"{rate('f', 'extract')} | {rate('f', 'bare')}"
        capture = f"{{median({per_round('minimal', 'bare')})|.3f}}"
    return c(
        EFF + file,
        f"| {label} | {rates} | {{f.ratio_per_round.median|.3f}} ({{f.ratio_per_round.min|.2f}}–"
        f"{{f.ratio_per_round.max|.2f}}) | {capture} | `{file}` |",
    )


def job(run: str, name: str) -> str:
    return f"{{{name}.s|.0f}} s"


HISTORY = [
    c(
        {"e": "default_run/bench_eagle3_e8cdefe.json", "w": "default_run/full_run_e8cdefe.json"},
        "DAG {w.wall_s|,.0f} s; τ "
        + " / ".join(
            f"{{e.runs.where(prompt_set={s!r}).acceptance_length|.3f}}"
            for s in ("mtbench", "humaneval", "heldout")
        )
        + " (predicted {e.runs[0].predicted_acceptance_length|.3f}); speed ratios "
        "{span([r.speedup for r in e.runs])|.2f}×",
    ),
    c(
        {
            "m": "gpu_runs/gpu/bench/metrics.json",
            **{
                n: f"gpu_runs/gpu/benchmarks/{n}.tsv"
                for n in (
                    "target",
                    "synth",
                    "extract_part0",
                    "train",
                    "bench",
                    "prompts",
                    "prepare",
                    "vocab",
                    "report",
                    "extract_gather",
                )
            },
        },
        "{target.s + synth.s + extract_part0.s + train.s + bench.s + prompts.s + prepare.s + "
        "vocab.s + report.s + extract_gather.s|.0f} s of job time (target {target.s|.0f} s, "
        "synth {synth.s|.0f} s, extract {extract_part0.s|.0f} s, train {train.s|.0f} s, bench "
        "{bench.s|.0f} s); τ {m.runs.where(prompt_set='mtbench').acceptance_length|.3f} "
        "(MT-Bench), {m.runs.where(prompt_set='humaneval').acceptance_length|.2f} (HumanEval); "
        "speed ratios {span([r.speedup for r in m.runs if r['concurrency'] == 1])|.2f}× at "
        "concurrency 1, {span([r.speedup for r in m.runs if r['concurrency'] == 8])|.2f}× at 8",
    ),
    c(
        {
            "p": f"{QUALITY}prompts/stats.json",
            **{n: f"{QUALITY}benchmarks/{n}.tsv" for n in ("prompts",)},
        },
        "| prompts | {prompts.s|.0f} s | {p.train.sharegpt.kept|,} samples: every user turn of "
        "ShareGPT",
    ),
    c(
        {"s": f"{QUALITY}synth/stats.json", "synth": f"{QUALITY}benchmarks/synth.tsv"},
        "| synth | {synth.s|.0f} s | {s.samples_ok|,} answers, {s.prompt_tokens / 1e6|.2f}M prompt "
        "+ {s.completion_tokens / 1e6|.2f}M completion tokens, "
        "{s.generation.completion_tokens_per_s / 1e3|.1f}K tok/s at concurrency 256, beside the "
        "default GPU run; {s.template_check.text_mismatches} template text mismatches",
    ),
    c(
        {
            "r": f"{QUALITY}prepare/stats.json",
            "prepare": f"{QUALITY}benchmarks/prepare.tsv",
            "vocab": f"{QUALITY}benchmarks/vocab.tsv",
        },
        "| prepare + vocab | {prepare.s + vocab.s|.0f} s | {r.rows_kept|,} rows, "
        "{r.tokens_total / 1e6|.1f}M tokens ({r.tokens_trainable / 1e6|.2f}M trainable) |",
    ),
    c(
        {
            "h": f"{QUALITY}hidden_states/manifest.json",
            "e": f"{QUALITY}benchmarks/extract_part0.tsv",
        },
        "| extract | {e.s|.0f} s | {h.tokens / 1e6|.1f}M tokens in fp8 ({h.bytes / 1e9|.1f} GB, "
        "{h.bytes_per_token|,.0f} B a token), {h.parts[0].this_run.tokens_per_s / 1e3|.1f}K tok/s; "
        "next-token agreement {h.verification.next_token_agreement * 100|.1f}% over "
        "{h.verification.next_token_positions / 1e6|.2f}M positions; reference error "
        "{h.verification.reference_max_rel_error|.3f} |",
    ),
    c(
        {"d": f"{QUALITY}drafter/metrics.json", "t": f"{QUALITY}benchmarks/train.tsv"},
        "| train | {t.s|.0f} s | 3 epochs, {d.throughput.tokens_per_s / 1e3|.0f}K tok/s; "
        "validation "
        "accuracy per TTT step "
        + " / ".join(f"{{d.epochs[d.best_epoch].val.full_acc[{i}]|.3f}}" for i in range(3))
        + " (full): predicted τ {1 + sum(d.epochs[d.best_epoch].val.full_acc.value)|.2f} |",
    ),
    c(
        f"{QUALITY}hidden_states/manifest.json",
        "spent {f.parts[0].this_run.validator_s_per_phase.checks|.0f} s on per-sample checks and "
        "{f.parts[0].this_run.validator_s_per_phase.probe|.0f} s on the next-token probe against "
        "{f.parts[0].this_run.validator_s_per_phase.wait_write|.0f} s waiting for vLLM's writes, "
        "over {f.parts[0].this_run.elapsed_s|.0f} s of wall time",
    ),
    c(
        "quality_vs_data/synth_repetition_gpu_quality.json",
        "{f.answers|,} answers, {f.completion_tokens / 1e6|.2f}M completion tokens, "
        "{f.stopped_at_max_tokens * 100|.0f}% at `max_tokens`, "
        + " / ".join(f"{{f.repeated_ngram_token_share['{n}'] * 100|.0f}}%" for n in (4, 8, 16, 32))
        + " of answer tokens continue a 4- / 8- / 16- / 32-gram",
    ),
    c(
        "quality_vs_data/gpu_quality_19k_cpu_tau.json",
        "(τ {span([r.acceptance_length for r in f.results if r['temperature'] == 1.0])|.2f} on "
        "MT-Bench, HumanEval and held-out)",
    ),
    earlier_row(
        "synth, 135M, c = 64, 128 tokens, 1,536 prompts, the client over httpx",
        "h200_synth_throughput_rounds.json",
        synth=True,
    ),
    earlier_row(
        "extraction, 135M, c = 32, 1,536 rows, the `openai` typed route",
        "h200_extract_throughput_135m_rounds.json",
    ),
    earlier_row(
        "extraction, 8B shape, 512 rows, typed route (rounds of 3–8 s weigh every server hiccup)",
        "h200_extract_throughput_8b_rounds.json",
    ),
    earlier_row("the same, 1,536 rows", "h200_extract_throughput_8b_1536_rounds.json"),
    earlier_row(
        "the same, 1,024 rows, 0.5 ms switch interval",
        "h200_extract_throughput_8b_switch_rounds.json",
    ),
    earlier_row(
        "8B, plain JSON over aiohttp, the copying validator",
        "h200_extract_throughput_8b_client_rounds.json",
    ),
    earlier_row(
        "8B, the copy-free validator, the pool waiting for vLLM's writes",
        "h200_extract_throughput_8b_copyfree_rounds.json",
    ),
    earlier_row(
        "135M, plain JSON over aiohttp, the copying validator",
        "h200_extract_throughput_135m_client_rounds.json",
    ),
    earlier_row(
        "8B, fp8 quantized and copied inside the engine step",
        "h200_extract_throughput_8b_fp8_rounds.json",
    ),
    c(
        EFF + "cpu_extract_throughput_wait.json",
        "0.955 ({f.separate_wait_gain.min|.2f}–{f.separate_wait_gain.max|.2f}), extraction ÷ "
        "bare prefill {f.ratio_per_round.median|.3f} ({f.ratio_per_round.min|.2f}–"
        "{f.ratio_per_round.max|.2f})",
    ),
    c(
        {
            "b": EFF + "cpu_extract_throughput_before.json",
            "a": EFF + "cpu_extract_throughput_after.json",
            "p": EFF + "cpu_extract_throughput_after_positions64.json",
        },
        "| extraction ÷ bare prefill, per round (median tok/s) | "
        + " | ".join(
            f"{{{x}.ratio_per_round.median|{spec}}} ({{{x}.ratio_per_round.min|.2f}}–"
            f"{{{x}.ratio_per_round.max|.2f}}) ({{{x}.median.extract|.0f}} / "
            f"{{{x}.median.bare|.0f}})"
            for x, spec in (("b", ".3f"), ("a", ".2f"), ("p", ".2f"))
        )
        + " | the same |\n| capture only ÷ bare prefill, per round | "
        + " | ".join(
            f"{{median([r.minimal.tokens_per_s / r.bare.tokens_per_s for r in {x}.rounds])|.3f}}"
            for x in "bap"
        )
        + " | the same |",
    ),
    c(
        {
            "b": EFF + "cpu_synth_throughput_before.json",
            "a": EFF + "cpu_synth_throughput_after.json",
        },
        "| synth client ÷ bare client, per round (median tok/s) | "
        + " | ".join(
            f"{{{x}.ratio_per_round.median|.3f}} ({{{x}.ratio_per_round.min|.2f}}–"
            f"{{{x}.ratio_per_round.max|.2f}}) ({{{x}.median.pipeline|.1f}} / "
            f"{{{x}.median.bare|.1f}})"
            for x in "ba"
        )
        + " | |",
    ),
    c(
        {
            "c": EFF + "h200_extract_throughput_8b_copyfree_rounds.json",
            "l": EFF + "h200_extract_throughput_8b_client_rounds.json",
            "s": EFF + "h200_extract_throughput_135m_client_rounds.json",
        },
        "**{c.plain_json_gain.median|.2f}× "
        "({c.plain_json_gain.min|.2f}–{c.plain_json_gain.max|.2f})**"
        ", client CPU {c.client_cpu_s_per_sample_spread.extract.median * 1000|.1f} against "
        "{c.client_cpu_s_per_sample_spread.extract_typed.median * 1000|.1f} ms a sample; "
        "{l.plain_json_gain.median|.2f}× ({l.plain_json_gain.min|.2f}–{l.plain_json_gain.max|.2f}) "
        "with the copying validator; 135M {s.plain_json_gain.median|.2f}× "
        "({s.plain_json_gain.min|.2f}–{s.plain_json_gain.max|.2f})",
    ),
    c(
        {
            "y": EFF + "h200_synth_throughput_client_rounds.json",
            "c": EFF + "h200_extract_throughput_8b_copyfree_rounds.json",
            "s": EFF + "h200_extract_throughput_135m_client_rounds.json",
        },
        "synth {y.aiohttp_gain.median|.2f}× ({y.aiohttp_gain.min|.2f}–{y.aiohttp_gain.max|.2f}), "
        "CPU {y.client_cpu_ms_per_request_spread.pipeline.median|.2f} against "
        "{y.client_cpu_ms_per_request_spread.pipeline_httpx.median|.2f} ms a request; extraction "
        "{c.aiohttp_gain.median|.2f}× ({c.aiohttp_gain.min|.2f}–{c.aiohttp_gain.max|.2f}), 135M "
        "{s.aiohttp_gain.median|.2f}× ({s.aiohttp_gain.min|.2f}–{s.aiohttp_gain.max|.2f})",
    ),
    c(
        {
            "l": EFF + "h200_extract_throughput_8b_client_rounds.json",
            "c": EFF + "h200_extract_throughput_8b_copyfree_rounds.json",
        },
        "| two runs | {l.ratio_per_round.median|.3f} ({l.ratio_per_round.min|.2f}–"
        "{l.ratio_per_round.max|.2f}) → {c.ratio_per_round.median|.3f} "
        "({c.ratio_per_round.min|.2f}–"
        "{c.ratio_per_round.max|.2f}), {l.median.extract / 1e3|.1f}K → "
        "{c.median.extract / 1e3|.1f}K"
        " tok/s;",
    ),
    c(
        EFF + "h200_extract_throughput_8b_wait_rounds.json",
        "| same rounds | {f.separate_wait_gain.median|.3f}× ({f.separate_wait_gain.min|.2f}–"
        "{f.separate_wait_gain.max|.2f}): within noise;",
    ),
    c(
        EFF + "h200_extract_throughput_8b_switch_rounds.json",
        "| same rounds, 1,024 rows | {f.switch_interval_gain.median|.3f}× "
        "({f.switch_interval_gain.min|.3f}–{f.switch_interval_gain.max|.3f}), every round above 1;",
    ),
    c(
        {
            "o": EFF + "h200_extract_throughput_8b_fp8_rounds.json",
            "n": EFF + "h200_extract_throughput_8b_fp8_sidestream_rounds.json",
        },
        "| two runs | {o.ratio_per_round.median|.3f} ({o.ratio_per_round.min|.2f}–"
        "{o.ratio_per_round.max|.2f}) → {n.ratio_per_round.median|.3f} "
        "({n.ratio_per_round.min|.2f}–"
        "{n.ratio_per_round.max|.2f}); capture only "
        "{median([r.minimal.tokens_per_s / r.bare.tokens_per_s for r in o.rounds])|.3f} → "
        "{median([r.minimal.tokens_per_s / r.bare.tokens_per_s for r in n.rounds])|.3f} |",
    ),
    c(
        {"t": EFF + "h200_train_throughput.json", "f": EFF + "h200_train_fp8.json"},
        "bf16: {t.ours.tokens_per_s / 1e3|.1f}K / {t.stock.tokens_per_s / 1e3|.1f}K tok/s = "
        "{t.ours.tokens_per_s / t.stock.tokens_per_s|.2f}; fp8: {f.ours.tokens_per_s / 1e3|.1f}K "
        "tok/s, loader wait {f.ours.loader_wait_fraction * 100|.2f}% of step time",
    ),
    c(
        EFF + "h200_hs_io.json",
        "{span([x.writer_gb_s for x in f])|.2f} / {span([x.validator_gb_s for x in f])|.2f} GB/s "
        "(hidden 4096: {f[0].validator_tokens_s / 1e3|.1f}K tok/s bf16, "
        "{f[1].validator_tokens_s / 1e3|.1f}K fp8; 7168: {f[2].validator_tokens_s / 1e3|.1f}K, "
        "{f[3].validator_tokens_s / 1e3|.1f}K)",
    ),
    c(
        EFF + "h200_reference_forward.json",
        "{f.float32_forward_s|.2f} s in float32 ({f.float32_peak_gib|.1f} GiB peak), "
        "{f.bfloat16_forward_s|.2f} s in bfloat16",
    ),
    c(EFF + "vocab_count_throughput.json", "{f.median_tok_s / 1e6|.1f}M tok/s, median of 5"),
    c(
        EFF + "plan_speed.json",
        "medians of {f.repeats}, load {f.load_average_after|.1f} | 2-core CPU | "
        "{span([r.cpu_s_median for r in f.rows if '-n' in r['command']])|.1f} s of CPU for every "
        "plan, {f.rows[0].cpu_s_median|.2f} s for `--version` (worst "
        "{f.worst_over_version_cpu|.2f}×; goal 1.5×)",
    ),
    c(
        "thinking_cpu/summary.json",
        "on the 2-core CPU ({f.wall_s / 60|.1f} min). The parser split reasoning off "
        "{f.synth.reasoning_capture_rate * f.synth.samples_ok|.0f} of {f.synth.samples_ok} answers "
        "({f.synth.reasoning_capture_rate|.2f};",
    ),
    c(
        "quality_vs_data/cpu_temperature_scan_19k.json",
        "| without the plugin, 24 MT-Bench prompts | "
        "{f.results.where(temperature=0.0).acceptance_length|.2f} | "
        "{f.results.where(temperature=0.01).acceptance_length|.2f} (T = 0.3: "
        "{f.results.where(temperature=0.3).acceptance_length|.2f}; T = 1: "
        "{f.results.where(temperature=1.0).acceptance_length|.2f}; first-position acceptance "
        "{f.results.where(temperature=0.01).per_position[0]|.3f} against "
        "{f.results.where(temperature=0.0).per_position[0]|.3f} at T = 0) |",
    ),
    c(
        {
            "w": "quality_vs_data/cpu_sampling_check.json",
            "p": "quality_vs_data/cpu_sampling_check_fixed.json",
        },
        "| {w.results.where(temperature=0.0).acceptance_length|.2f} / "
        "{p.results.where(temperature=0.0).acceptance_length|.2f} | "
        "{span([r.acceptance_length for r in w.results if r['temperature'] > 0])|.2f} seeded or "
        "not, at concurrency 8 or 1 / {p.results.where(temperature=0.01, seeded=True, "
        "concurrency=8).acceptance_length|.2f} (seeded, c = 8 and 1; unseeded, c = 1), "
        "{p.results.where(temperature=0.01, seeded=False, concurrency=8).acceptance_length|.2f} "
        "(unseeded, c = 8) |",
    ),
    c(
        {
            "f": "quality_vs_data/quality_drafters_cpu_tau_t1_fixed.json",
            "g": "quality_vs_data/h200_quality_t0_tau.json",
            "s": "quality_vs_data/h200_quality_t1_tau.json",
        },
        "greedy-data drafter MT-Bench "
        "{f.results.where(drafter='/tmp/drafters/results/gpu-quality/drafter/eagle3', "
        "prompt_set='mtbench').acceptance_length|.2f}, held-out "
        "{f.results.where(drafter='/tmp/drafters/results/gpu-quality/drafter/eagle3', "
        "prompt_set='heldout').acceptance_length|.2f}; sampled-data "
        "{f.results.where(drafter='/tmp/drafters/results/gpu-quality-t1/drafter/eagle3', "
        "prompt_set='mtbench').acceptance_length|.2f} and "
        "{f.results.where(drafter='/tmp/drafters/results/gpu-quality-t1/drafter/eagle3', "
        "prompt_set='heldout').acceptance_length|.2f} (H200: "
        "{g.results.where(prompt_set='mtbench', temperature=1.0).acceptance_length|.2f}, "
        "{g.results.where(prompt_set='heldout', temperature=1.0).acceptance_length|.2f}, "
        "{s.results.where(prompt_set='mtbench', temperature=1.0).acceptance_length|.2f}, "
        "{s.results.where(prompt_set='heldout', temperature=1.0).acceptance_length|.2f})",
    ),
    *[
        c(
            f"quality_vs_data/synth_repetition_h200_{t}.json",
            f"| {label} | {{f.answers|,}} | {{f.completion_tokens / 1e6|.2f}}M | "
            "{f.stopped_at_max_tokens * 100|.1f}% | "
            + " / ".join(
                f"{{f.repeated_ngram_token_share['{n}'] * 100|.1f}}%" for n in (4, 8, 16, 32)
            )
            + " | {f.cut_loops['32'].answers_cut * 100|.1f}% of answers, "
            "{f.cut_loops['32'].tokens_cut * 100|.1f}% of tokens | "
            "{f.cut_loops['16'].answers_cut * 100|.1f}% of answers, "
            "{f.cut_loops['16'].tokens_cut * 100|.1f}% of tokens |",
        )
        for t, label in (("t0", "T = 0"), ("t1", "T = 1"))
    ],
    c(
        "scale_out/synth_journal_scale.json",
        "**A part's start**: "
        "{spread([r.seconds for r in f.by_source['/work/main/src'].part.runs])|.1f s} "
        "and {f.by_source['/work/main/src'].part.peak_rss_mib_max|,} MiB peak holding every entry "
        "whole, **{spread([r.seconds for r in f.by_source['/work/wt/src'].part.runs])|.1f s} and "
        "{f.by_source['/work/wt/src'].part.peak_rss_mib_max} MiB** holding its bookkeeping; **the "
        "gather's walk** (every answer read whole in prompt order): "
        "{spread([r.seconds for r in f.by_source['/work/main/src'].gather.runs])|.1f s}, "
        "{f.by_source['/work/main/src'].gather.peak_rss_mib_max|,} MiB against "
        "{spread([r.seconds for r in f.by_source['/work/wt/src'].gather.runs])|.1f s}, "
        "{f.by_source['/work/wt/src'].gather.peak_rss_mib_max} MiB",
    ),
]
HISTORY.append(
    c(
        {
            "a": "gpu_runs/synth-levers/gpu-quality/synth/stats.json",
            "b": "gpu_runs/synth-levers/gpu-quality-t1/synth/stats.json",
            "ja": "gpu_runs/synth-levers/gpu-quality/benchmarks/synth.tsv",
            "jb": "gpu_runs/synth-levers/gpu-quality-t1/benchmarks/synth.tsv",
        },
        "synth jobs of {ja.s|.0f} s and {jb.s|.0f} s, "
        "{a.generation.completion_tokens_per_s / 1e3|.1f}K and "
        "{b.generation.completion_tokens_per_s / 1e3|.1f}K completion tokens/s at concurrency "
        "{a.provenance.params.concurrency}",
    )
)
HISTORY.append(
    c(
        {
            "a": EFF + "h200_extract_throughput_135m_client_rounds.json",
            "b": EFF + "h200_extract_throughput_135m_waitthreads_rounds.json",
            "c": EFF + "h200_extract_throughput_8b_client_rounds.json",
            "d": EFF + "h200_extract_throughput_8b_wait_rounds.json",
            "e": EFF + "h200_extract_throughput_135m_rounds.json",
            "f": EFF + "h200_extract_throughput_8b_1536_rounds.json",
        },
        "bare prefill {a.median.bare / 1e3|.1f}–{b.median.bare / 1e3|.1f}K tok/s at 135M and "
        "{c.median.bare / 1e3|.1f}–{d.median.bare / 1e3|.1f}K at 8B against "
        "{e.median.bare / 1e3|.1f}K and {f.median.bare / 1e3|.1f}K with the earlier clients",
    )
)
