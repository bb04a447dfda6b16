"""The bench stage's two jobs: each drafter under vLLM speculative decoding (rule ``bench``,
:func:`run`) against the target without a drafter, and that baseline on its own (rule
``bench_baseline``, :func:`run_baseline`) where the two cannot be up at once.

``bench.pairing: alternate`` (the default): a bench job starts the baseline server and, for
each ``k``, a drafter server beside it, and alternates rounds between the two (see
:mod:`.measure`); its speedups are paired per round. ``separate``: the baseline is measured
once in its own job and shared by every drafter's job (for a target that cannot be loaded
twice, e.g. a 1T model at TP=8 on one node); its speedups are ratios of medians, with a
spread that allows for everything the rounds saw.

Before any server starts, the drafter is checked against what extraction and the target say
(:mod:`eagle3_pipeline.methods.consistency`): acceptance barely moves when these are wrong, so they
are checked structurally.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .. import methods
from ..engine import cpu_fixes as vllm_cpu_fixes
from ..engine.spec import seeded_sampling_args, served_dtype, spec_for_target
from ..methods import consistency, predicted_acceptance_length
from ..prompts.selection import context_tokens
from ..runtime import results
from ..runtime.files import sha256_file, write_json
from ..runtime.provenance import provenance
from ..server import ServerError, VllmServer
from ..stats import median
from ..target.chat import context_limit
from ..target.serving import facts_of
from ..target.stage import load_info
from . import features as features_lib
from . import gate as gate_lib
from .cache import baseline_key, drafter_identity, drafter_key, measure_cached
from .measure import (
    BASELINE,
    DRAFTER,
    BenchError,
    acceptance,
    bench_rounds,
    compare_outputs,
    latency,
    measure_alternating,
    measure_rounds,
)
from .verdict import judge, speedup_stats, summarize

log = logging.getLogger(__name__)

# The GPU memory share of each of two servers up at once (bench.pairing: alternate).
PAIRED_MEMORY_SHARE = 0.45
MEMORY_FLAG = "--gpu-memory-utilization"


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def server_args(cfg: dict, vllm_cfg: dict, paired: bool = False) -> list[str]:
    """The bench servers' own arguments: ``bench.server_args``, and as many sequences as the
    benchmark ever sends at once (the highest ``bench.concurrency``) unless the user set it.

    vLLM reserves draft slots for every sequence it could schedule out of the batch's token
    budget: on vLLM 0.26 a DFlash drafter at k = 15 with the H200 default of 1,024 sequences
    needs 14 x 1,024 slots of a budget of 8,192 and the server refuses to start
    ("max_num_scheduled_tokens is set to -6144"). A benchmark never has more sequences in
    flight than its concurrency, so the cap changes no measurement; baseline and drafter
    servers get the same one. It also shortens the CUDA graph capture at start.

    ``paired``: two servers share the GPUs (bench.pairing: alternate), each gets at most
    :data:`PAIRED_MEMORY_SHARE` of their memory."""
    args = list(cfg["server_args"])
    every = [*vllm_cfg["extra_args"], *args]
    if not any(a.split("=")[0] == "--max-num-seqs" for a in every):
        args += ["--max-num-seqs", str(max(cfg["concurrency"]))]
    if any(t > 0 for t in cfg.get("temperatures", ())):  # every request is seeded (measure)
        args += seeded_sampling_args(vllm_cfg, args)
    if paired and vllm_cfg["device"] == "cuda":
        share = _flag_value(every, MEMORY_FLAG)
        if share is None:
            args += [MEMORY_FLAG, str(PAIRED_MEMORY_SHARE)]
        elif float(share) > PAIRED_MEMORY_SHARE:
            raise BenchError(
                f"bench.pairing: alternate keeps the baseline and a drafter server up together, "
                f"but {MEMORY_FLAG} {share} (vllm.extra_args / bench.server_args) leaves no room "
                f"for the second one: give at most {PAIRED_MEMORY_SHARE}, or set "
                "bench.pairing: separate for a target that cannot be loaded twice"
            )
    return args


def speculative_config(method: str, drafter_dir, k: int, cfg: dict) -> dict:
    """vLLM's speculative_config for a ``method`` drafter in ``drafter_dir`` drafting ``k``
    tokens, with the bench section ``cfg``'s extra fields (bench.speculative_config)."""
    return {
        "model": str(drafter_dir),
        **methods.get(method).speculative_config(),
        "num_speculative_tokens": k,
        **cfg.get("speculative_config", {}),
    }


def start_server(
    cfg: dict,
    vllm_cfg: dict,
    target: dict,
    spec_cfg: dict | None,
    what: str,
    log_path,
    paired: bool = False,
    cache_root=None,
    env: dict[str, str] | None = None,
) -> VllmServer:
    """A vLLM server for the target, with the drafter of ``spec_cfg`` (None: without one);
    ``cache_root``: its own vLLM compile cache (servers compiling side by side); ``env``:
    more environment for it."""
    spec = spec_for_target(
        vllm_cfg,
        target,
        extra_args=server_args(cfg, vllm_cfg, paired),
        speculative_config=spec_cfg,
    )
    spec.env.update(env or {})
    try:
        return VllmServer(spec, log_path, cache_root).start()
    except ServerError as e:
        hint = (
            f"If the message below names the drafter, its checkpoint at {spec_cfg['model']} is "
            "not loadable by this vLLM.\n"
            if spec_cfg
            else ""
        )
        raise BenchError(f"vLLM failed to start {what}. {hint}{e}") from e


def check_context(target_json, sets: dict[str, list[dict]], cfg: dict, vllm_cfg: dict) -> None:
    """Every prompt of ``sets`` fits the context its answer leaves (vllm.max_model_len -
    bench.max_tokens, counted with the target's tokenizer and chat template): a server refuses
    one that does not, which would fail the job at that request. The prompts stage skips such
    prompts from the sets it writes; the held-out set is checked there against synth's answers,
    so this finds one where bench.max_tokens is the larger. Run before any server starts."""
    context = context_limit(
        target_json,
        vllm_cfg["max_model_len"],
        "bench.max_tokens",
        cfg["max_tokens"],
        cfg.get("chat_template_kwargs") or {},
    )
    over = [
        f"{name}/{p['id']} ({tokens} tokens)"
        for name, prompts in sets.items()
        for p in prompts
        if (tokens := context_tokens(p, context)) > context.max_tokens
    ]
    if over:
        raise BenchError(
            f"{len(over)} prompt(s) are longer than the context leaves for the answer, "
            f"{context.max_tokens} tokens ({context.why}): {', '.join(over[:10])}; a server "
            f"would refuse them: {context.fix()}"
        )


def _kept_with_k(keep, k: int):
    """``keep`` for the measurements of the drafter server at ``k``: each run labelled with it."""
    return lambda name, runs: keep(name, [{"k": k, **r} for r in runs], k)


# ---- rule bench_baseline (bench.pairing: separate) ---------------------------------------


def run_baseline(
    target_json,
    prompt_files: dict[str, str],
    out,
    cfg: dict,
    vllm_cfg: dict,
    cache_dir,
    log_path=None,
) -> dict:
    """Rule ``bench_baseline``: every prompt set without a drafter (one server, ``bench.rounds``
    passes per measurement), shared by every drafter's job and kept per set in ``cache_dir``.
    Writes the runs (throughput and, for the T=0 comparisons, the output token ids)."""
    t0 = time.monotonic()
    target = load_info(target_json)
    key = baseline_key(target, cfg, vllm_cfg)
    rounds = bench_rounds(cfg, vllm_cfg)

    def measure_todo(todo: dict[None, dict[str, list[dict]]], keep) -> int:
        check_context(target_json, todo[None], cfg, vllm_cfg)
        server = start_server(cfg, vllm_cfg, target, None, "the baseline server", log_path)
        try:
            measure_rounds(server, todo[None], cfg, rounds, BASELINE, keep)
        finally:
            server.stop()
        return 1

    by_set, this_run = measure_cached(prompt_files, cache_dir, key, measure_todo)
    baseline = {
        "format": results.format_tag(results.BENCH_BASELINE),
        "sets": {
            name: {"prompts_sha256": sha256_file(prompt_files[name]), "runs": runs}
            for name, runs in by_set.items()
        },
        "settings": key[2],
        "chat_template_kwargs": cfg.get("chat_template_kwargs") or {},
        "this_run": this_run,
        "elapsed_s": round(time.monotonic() - t0, 1),
        "provenance": provenance(cfg, inputs=prompt_files),
    }
    write_json(out, baseline)
    return baseline


# ---- rule bench ------------------------------------------------------------------------------


def _separate_baseline(baseline: dict, name: str, prompts_path) -> dict[tuple, dict]:
    entry = baseline["sets"].get(name)
    if entry is None or entry["prompts_sha256"] != sha256_file(prompts_path):
        raise BenchError(
            f"the baseline has no measurement of prompt set {name!r} as it is now: re-run "
            "bench_baseline"
        )
    return {(r["temperature"], r["concurrency"]): r for r in entry["runs"]}


def predicted_for(prediction: dict, row: dict) -> float | None:
    """τ the drafter's validation predicts for a result row, at T = 0 only: validation scores
    a draft against the target's argmax, which greedy decoding accepts; at T > 0 a draft is
    accepted with the target's probability of it, which validation does not see."""
    if row["temperature"] != 0:
        return None
    return predicted_acceptance_length(prediction, row["k"])


def drafter_rows(
    name: str, drafted: list[dict], method: str, separate: dict[tuple, dict] | None = None
) -> list[dict]:
    """One prompt set's result rows: per (k, temperature, concurrency) the drafter's rounds
    next to the baseline's (paired rounds of the same entry, or with ``separate`` the shared
    baseline's entry of the same temperature and concurrency): tokens per second (medians),
    speedup with its spread and significance, acceptance over every round, and at T=0 the
    outputs compared token by token."""
    rows = []
    for entry in drafted:
        t, c = entry["temperature"], entry["concurrency"]
        drafter = [r[DRAFTER] for r in entry["rounds"]]
        surroundings = list(entry.get("surroundings") or [])
        if separate is None:
            base = [r[BASELINE] for r in entry["rounds"]]
        else:
            if (t, c) not in separate:
                raise BenchError(
                    f"the baseline of {name!r} has no run at T={t}, concurrency {c}: re-run "
                    "bench_baseline"
                )
            base = [r[BASELINE] for r in separate[(t, c)]["rounds"]]
            surroundings += separate[(t, c)].get("surroundings") or []
        d_tps = [p["tokens_per_s"] for p in drafter]
        b_tps = [p["tokens_per_s"] for p in base]
        row = {
            "method": method,
            "prompt_set": name,
            "k": entry["k"],
            "temperature": t,
            "concurrency": c,
            "requests": drafter[0]["requests"],
            **acceptance(p["counts"] for p in drafter),
            "tokens_per_s": median(d_tps),
            "baseline_tokens_per_s": median(b_tps),
            **speedup_stats(d_tps, b_tps, paired=separate is None),
            "pairing": "alternate" if separate is None else "separate",
            "tokens_per_s_rounds": d_tps,
            "baseline_tokens_per_s_rounds": b_tps,
            "latency_s": latency(drafter),
            "baseline_latency_s": latency(base),
            "output_tokens": drafter[0]["output_tokens"],
            "baseline_output_tokens": base[0]["output_tokens"],
            "surroundings": surroundings,
        }
        if t == 0:
            row["outputs_vs_baseline"] = compare_outputs(base[0]["outputs"], drafter[0]["outputs"])
        rows.append(row)
    return rows


def run(
    target_json,
    drafter_dir,
    manifest_path,
    train_metrics,
    prompt_files: dict[str, str],
    metrics_out,
    cfg: dict,
    vllm_cfg: dict,
    cache_dir,
    baseline_json=None,
    log_path=None,
    name: str | None = None,
) -> dict:
    """Rule ``bench`` (one job per drafter): measure (or take from ``cache_dir``) the drafter
    on every prompt set, one server per k, against the baseline (a server of its own beside
    it, or with ``bench.pairing: separate`` the shared ``baseline_json``), judge, write the
    metrics. The method and its limits come from the drafter's config; ``name`` (its name in
    train.methods, a method or a variant; default: the method) labels its rows."""
    target = load_info(target_json)
    # the extraction's manifest; online/hybrid (none) what the train job extracted itself
    trained = results.read_result(train_metrics, results.TRAIN_METRICS)
    if manifest_path:
        manifest = results.read_result(manifest_path, results.HIDDEN_STATES)
    else:
        manifest = trained["hidden_states"]
    drafter_dir = str(Path(drafter_dir).resolve())
    check = consistency.check(drafter_dir, manifest, target)
    if not check["ok"]:
        raise BenchError(
            "the drafter does not match this run's extraction/target:\n  - "
            + "\n  - ".join(check["problems"])
        )
    method = check["drafter"]["speculators_model_type"]
    own = methods.get(method)
    limit = own.drafter_max_tokens(check["drafter"])
    ks = cfg["num_speculative_tokens"]
    too_many = [k for k in ks if limit is not None and k > limit]
    if too_many:
        raise BenchError(
            f"this {method} drafter drafts at most {limit} tokens; "
            f"bench.num_speculative_tokens asks for {too_many}"
        )
    paired = cfg["pairing"] == "alternate"
    if not paired and baseline_json is None:
        raise BenchError("bench.pairing: separate needs the baseline's measurements")
    rounds = bench_rounds(cfg, vllm_cfg)
    prediction = trained.get("prediction") or {}
    name = name or method
    t0 = time.monotonic()

    # the aux features the served drafter is fed, checked on its first server (stored hidden
    # states only: online and hybrid runs keep none to compare with)
    identity = drafter_identity(drafter_dir)
    probe = own.speculative_config()["method"] == "eagle3" and bool(manifest_path)
    served_features = features_lib.cached(cache_dir, identity, manifest) if probe else None

    def drafter_server(k: int) -> VllmServer:
        nonlocal served_features
        spec_cfg = speculative_config(method, drafter_dir, k, cfg)
        what = f"the server with the {method} drafter (k={k})"
        probe_here = probe and served_features is None
        probe_dir = features_lib.probe_dir() if probe_here else None
        env = features_lib.probe_env(probe_dir) if probe_here else None
        server = start_server(cfg, vllm_cfg, target, spec_cfg, what, log_path, paired, env=env)
        if probe_here:
            try:
                served_features = features_lib.check(
                    server.base_url,
                    server.spec.model,
                    probe_dir,
                    manifest,
                    check["drafter"]["aux_layer_ids"],
                    vllm_cfg["max_model_len"],
                )
            except Exception:
                server.stop()
                raise
            problem = features_lib.verdict_problem(served_features)
            if problem:
                server.stop()
                raise BenchError(problem)
            features_lib.keep(cache_dir, identity, manifest, served_features)
            log.info(
                "served drafter's features match the extraction: relative error per aux "
                "layer %s over %d positions",
                [round(e, 5) for e in served_features["rel_err_per_layer"]],
                served_features["positions"],
            )
        return server

    def measure_todo(todo: dict[int, dict[str, list[dict]]], keep) -> int:
        """One drafter server per k with sets to measure, beside one baseline server."""
        check_context(
            target_json, {n: p for sets in todo.values() for n, p in sets.items()}, cfg, vllm_cfg
        )
        baseline = None
        if paired:
            what = "the baseline server (no drafter)"
            baseline = start_server(cfg, vllm_cfg, target, None, what, log_path, paired)
        try:
            for k, sets in todo.items():
                server = drafter_server(k)
                try:
                    if paired:
                        servers = {BASELINE: baseline, DRAFTER: server}
                        measure_alternating(servers, sets, cfg, rounds, _kept_with_k(keep, k))
                    else:
                        measure_rounds(server, sets, cfg, rounds, DRAFTER, _kept_with_k(keep, k))
                finally:
                    server.stop()
        finally:
            if baseline is not None:
                baseline.stop()
        return len(todo) + paired

    key = drafter_key(drafter_dir, target, cfg, vllm_cfg)
    by_set, this_run = measure_cached(prompt_files, cache_dir, key, measure_todo)
    shared = None if paired else results.read_result(baseline_json, results.BENCH_BASELINE)
    order = {
        "k": ks,
        "temperature": cfg["temperatures"],
        "concurrency": cfg["concurrency"],
        "prompt_set": list(prompt_files),
    }
    runs = sorted(
        (
            {
                **row,
                "predicted_acceptance_length": predicted_for(prediction, row),
            }
            for set_name, drafted in by_set.items()
            for row in drafter_rows(
                set_name,
                drafted,
                name,
                None if paired else _separate_baseline(shared, set_name, prompt_files[set_name]),
            )
        ),
        key=lambda r: tuple(values.index(r[key]) for key, values in order.items()),
    )
    # on the CPU, whether vLLM could load the fix that makes acceptance at T > 0 right
    cpu_sampling_fix = vllm_cpu_fixes.installed() if vllm_cfg["device"] == "cpu" else None
    # in float32 speculative decoding at T = 0 must give the target's own tokens
    served = served_dtype(vllm_cfg["device"], vllm_cfg["dtype"], facts_of(target["model_path"]))
    exact = served == "float32"
    verdict = judge(runs, cpu_sampling_fix, exact_outputs=exact)
    gate_path = Path(metrics_out).with_name(gate_lib.GATE_FILE)
    gate = gate_lib.judge(runs, gate_lib.floors_for(cfg.get("gate") or {}, name), gate_path)
    shorter = own.serve_notes(check["drafter"], ks)
    for note in shorter:
        log.warning("%s: NOT SERVED AS TRAINED at %s", name, note)
    metrics = {
        "format": results.format_tag(results.BENCH_METRICS),
        "method": name,
        "speculators_method": method,
        "pairing": cfg["pairing"],
        "rounds": rounds,
        "chat_template_kwargs": cfg.get("chat_template_kwargs") or {},
        "vllm_cpu_sampling_fix": cpu_sampling_fix,
        "runs": runs,
        "summary": summarize(runs),
        "verdict": verdict,
        "gate": gate,
        "consistency": check,
        "served_features": served_features
        or {"checked": False, "why": "no stored hidden states (extract.mode) or not EAGLE-3"},
        "served_with_shorter_block": shorter,
        "prediction": prediction,
        "this_run": this_run,
        "elapsed_s": round(time.monotonic() - t0, 1),
        "provenance": provenance(
            cfg, inputs={"drafter": Path(drafter_dir) / "model.safetensors", **prompt_files}
        ),
    }
    write_json(metrics_out, metrics)
    (log.error if not verdict["ok"] else log.info)("%s verdict: %s", name, verdict["message"])
    keep_gate(gate_path, gate, name, runs)
    if gate is not None and not gate["passed"]:
        raise BenchError(gate["message"])
    return metrics


def keep_gate(path: Path, gate: dict | None, name: str, runs: list[dict]) -> None:
    """Write the gate's checks and every measurement's acceptance to ``path``, beside the
    metrics but not a declared output, so that they survive the job failing on the gate
    (Snakemake deletes a failed job's outputs); without floors, remove an earlier one."""
    if gate is None:
        path.unlink(missing_ok=True)
        return
    (log.info if gate["passed"] else log.error)("%s: %s", name, gate["message"])
    acceptance = ("acceptance_length", "per_position", "drafts")
    write_json(
        path,
        {
            "drafter": name,
            **gate,
            "acceptance": [
                {k: r[k] for k in ("prompt_set", "k", "temperature", "concurrency", *acceptance)}
                for r in runs
            ],
        },
    )
