"""Bench stage: each method's drafter under real vLLM speculative decoding, next to one
baseline.

The baseline (no drafter) is measured once per run (rule ``bench_baseline``,
:func:`run_baseline`) and shared by every method's bench job (rule ``bench``, :func:`run`),
which measures its drafter with one server per ``k`` (num_speculative_tokens) on the same
requests. Acceptance comes from the spec-decode Prometheus counters (deltas around each run):
tau = 1 + accepted / drafts, and per-position acceptance = accepted_at_pos / drafts.
Throughput is output tokens / wall time; at temperature 0 the outputs with and without the
drafter are compared token by token. Both jobs keep each prompt set's runs in a cache keyed by
what they depend on, so an unchanged set is not measured again.

Before any server starts, the drafter is checked against what extraction and the target say
(:mod:`eagle3_pipeline.consistency`: layer ids, sizes, vocabulary map, sliding window, verifier
path, the method's own fields): acceptance barely moves when these are wrong, so they are
checked structurally.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from . import client as client_lib
from . import consistency
from .config import HELDOUT_SET, RESULT_KEYS
from .fileio import iter_jsonl, read_json, sha256_file, stable_hash, write_json
from .method_results import predicted_acceptance_length, shorter_block_notes
from .provenance import provenance
from .runtime import for_each
from .server import ServerError, VllmServer, spec_for_target
from .stats import percentiles
from .target import load_info

log = logging.getLogger(__name__)

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


class BenchError(RuntimeError):
    pass


# ---- metrics ---------------------------------------------------------------------------------


def scrape(base_url: str) -> dict[str, Any]:
    """Spec-decode counters from the server's Prometheus endpoint."""
    from prometheus_client.parser import text_string_to_metric_families

    with client_lib.sync_client(base_url, timeout=30, max_retries=3) as client:
        text = client_lib.get_text(client, "/metrics")
    out: dict[str, Any] = {name: 0.0 for name in SPEC_COUNTERS}
    per_pos: dict[int, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name.removesuffix("_total")
            if name in SPEC_COUNTERS and s.name.endswith("_total"):
                out[name] += s.value
            elif name == PER_POS and s.name.endswith("_total"):
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
    out[PER_POS] = per_pos
    return out


def acceptance(before: dict, after: dict) -> dict[str, Any]:
    drafts = after[SPEC_COUNTERS[0]] - before[SPEC_COUNTERS[0]]
    draft_tokens = after[SPEC_COUNTERS[1]] - before[SPEC_COUNTERS[1]]
    accepted = after[SPEC_COUNTERS[2]] - before[SPEC_COUNTERS[2]]
    positions = sorted(after[PER_POS])
    per_pos = [
        (after[PER_POS][p] - before[PER_POS].get(p, 0.0)) / drafts if drafts else None
        for p in positions
    ]
    return {
        "drafts": int(drafts),
        "draft_tokens": int(draft_tokens),
        "accepted": int(accepted),
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "per_position": per_pos,
    }


# ---- load generation ---------------------------------------------------------------------------


async def _run_set(
    base_url: str, model: str, prompts: list[dict], temperature: float, concurrency: int, cfg: dict
) -> dict[str, Any]:
    import openai

    results: list[dict | None] = [None] * len(prompts)

    async def go(client, i: int) -> None:
        body = {
            "model": model,
            "messages": prompts[i]["messages"],
            "max_tokens": cfg["max_tokens"],
            "temperature": temperature,
            "seed": 1234 + i,
            "return_token_ids": True,
        }
        t0 = time.monotonic()
        try:
            data = await client_lib.chat(client, body)
        except openai.APIError as e:
            raise BenchError(f"request {i} failed: {type(e).__name__}: {str(e)[:300]}") from e
        results[i] = {
            "latency_s": time.monotonic() - t0,
            "token_ids": data["choices"][0].get("token_ids") or [],
            "tokens": data["usage"]["completion_tokens"],
        }

    # No retries: a retried request would distort the timing; a failure is an error.
    client = client_lib.async_client(base_url, timeout=cfg["request_timeout_s"], max_retries=0)
    async with client:
        t0 = time.monotonic()
        await for_each(range(len(prompts)), lambda i: go(client, i), concurrency)
        wall = time.monotonic() - t0
    tokens = sum(r["tokens"] for r in results)
    return {
        "requests": len(prompts),
        "output_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall else None,
        "latency_s": percentiles([r["latency_s"] for r in results], (50, 100)),
        "outputs": [r["token_ids"] for r in results],
    }


def compare_outputs(base: list[list[int]], spec: list[list[int]]) -> dict[str, Any]:
    differing, examples = 0, []
    for i, (a, b) in enumerate(zip(base, spec, strict=True)):
        if a != b:
            differing += 1
            # the first position where they differ, or where the shorter one ends
            pos = next(
                (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)),
            )
            if len(examples) < 3:
                examples.append(
                    {
                        "request": i,
                        "first_diff_at": pos,
                        "baseline": a[pos : pos + 3],
                        "drafter": b[pos : pos + 3],
                    }
                )
    return {"compared": len(base), "differing": differing, "examples": examples}


def measure(
    server: VllmServer, sets: dict[str, list[dict]], cfg: dict, spec_decode: bool
) -> dict[tuple, dict]:
    out = {}
    # One short request first so that warm-up costs land outside the measured runs.
    first = next(iter(sets.values()))[:1]
    asyncio.run(
        _run_set(server.base_url, server.model_name, first, 0.0, 1, dict(cfg, max_tokens=8))
    )
    for temperature in cfg["temperatures"]:
        for conc in cfg["concurrency"]:
            for name, prompts in sets.items():
                before = scrape(server.base_url) if spec_decode else None
                res = asyncio.run(
                    _run_set(server.base_url, server.model_name, prompts, temperature, conc, cfg)
                )
                if spec_decode:
                    res["acceptance"] = acceptance(before, scrape(server.base_url))
                log.info(
                    "%s T=%s c=%d: %.1f tok/s%s",
                    name,
                    temperature,
                    conc,
                    res["tokens_per_s"],
                    f", tau {res['acceptance']['acceptance_length']}" if spec_decode else "",
                )
                out[(name, temperature, conc)] = res
    return out


# ---- the stage: one baseline, then each method's drafter ------------------------------------

# Result-determining keys (config.RESULT_KEYS) that do not change a measurement: the sets to
# report and the verdict's thresholds. A change re-runs the job, which re-judges cached results.
NOT_MEASURED = (
    "bench.prompt_sets",
    "bench.min_acceptance_length",
    "bench.min_measured_to_predicted",
)
# Bump when what a cache entry holds changes: older entries are then measured again.
CACHE_FORMAT = 2


def measurement_settings(cfg: dict, vllm_cfg: dict, rule: str = "bench") -> dict[str, Any]:
    """The result-determining settings of a measurement by ``rule`` (``bench_baseline`` or
    ``bench``; bench and vllm keys)."""
    sections = {"bench": cfg, "vllm": vllm_cfg}
    out = {}
    for key in RESULT_KEYS[rule]:
        if key not in NOT_MEASURED:
            section, name = key.split(".")
            out[key] = sections[section][name]
    return out


def drafter_identity(drafter_dir: str | Path) -> str:
    """The drafter's content: weights and config, without the verifier's path (a moved run
    keeps its cached results)."""
    drafter_dir = Path(drafter_dir)
    cfg = read_json(drafter_dir / "config.json")
    verifier = (cfg.get("speculators_config") or {}).get("verifier") or {}
    verifier.pop("name_or_path", None)
    return stable_hash({"config": cfg, "weights": sha256_file(drafter_dir / "model.safetensors")})


def set_fingerprint(drafter: str | None, target: dict, prompts_path, settings: dict) -> str:
    """What one prompt set's measurement depends on: the drafter (None: the baseline), the
    target, the prompts and the settings."""
    return stable_hash(
        {
            "format": CACHE_FORMAT,
            "drafter": drafter,
            "target": target["identity"],
            "prompts": sha256_file(prompts_path),
            "settings": settings,
        }
    )


def baseline_key(target: dict, cfg: dict, vllm_cfg: dict) -> tuple[None, dict, dict]:
    """What the baseline's cached measurements are keyed by (see measure_cached)."""
    return (None, target, measurement_settings(cfg, vllm_cfg, "bench_baseline"))


def drafter_key(drafter_dir, target: dict, cfg: dict, vllm_cfg: dict) -> tuple[str, dict, dict]:
    """What a drafter's cached measurements are keyed by (``cfg``: the bench section with the
    method's own num_speculative_tokens)."""
    return (drafter_identity(drafter_dir), target, measurement_settings(cfg, vllm_cfg))


def load_cached(cache_dir: Path, fp: str) -> list[dict] | None:
    path = cache_dir / f"{fp}.json"
    try:
        entry = read_json(path)
    except (OSError, ValueError):
        return None
    return entry["runs"] if entry.get("fingerprint") == fp else None


def server_args(cfg: dict, vllm_cfg: dict) -> list[str]:
    """The bench servers' own arguments: ``bench.server_args``, and as many sequences as the
    benchmark ever sends at once (the highest ``bench.concurrency``) unless the user set it.

    vLLM reserves draft slots for every sequence it could schedule out of the batch's token
    budget: on vLLM 0.26 a DFlash drafter at k = 15 with the H200 default of 1,024 sequences
    needs 14 x 1,024 slots of a budget of 8,192 and the server refuses to start
    ("max_num_scheduled_tokens is set to -6144"). A benchmark never has more sequences in
    flight than its concurrency, so the cap changes no measurement; baseline and drafter
    servers get the same one. It also shortens the CUDA graph capture at start."""
    args = list(cfg["server_args"])
    if not any(a.split("=")[0] == "--max-num-seqs" for a in [*vllm_cfg["extra_args"], *args]):
        args += ["--max-num-seqs", str(max(cfg["concurrency"]))]
    return args


def start_server(
    cfg: dict,
    vllm_cfg: dict,
    target: dict,
    spec_cfg: dict | None,
    what: str,
    log_path,
    cache_root=None,
) -> VllmServer:
    """A vLLM server for the target, with the drafter of ``spec_cfg`` (None: without one);
    ``cache_root``: its own vLLM compile cache (servers compiling side by side)."""
    spec = spec_for_target(
        vllm_cfg,
        target,
        extra_args=server_args(cfg, vllm_cfg),
        speculative_config=spec_cfg,
    )
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


def measure_on_server(
    sets: dict[str, list[dict]],
    cfg: dict,
    vllm_cfg: dict,
    target: dict,
    spec_cfg: dict | None,
    what: str,
    log_path,
) -> dict[str, list[dict]]:
    """Per prompt set, its runs (one per temperature and concurrency) on one server with the
    drafter of ``spec_cfg`` (None: the baseline), which is stopped whatever happens."""
    server = start_server(cfg, vllm_cfg, target, spec_cfg, what, log_path)
    try:
        measured = measure(server, sets, cfg, spec_decode=spec_cfg is not None)
    finally:
        server.stop()
    return runs_by_set(measured, sets)


def runs_by_set(measured: dict[tuple, dict], sets) -> dict[str, list[dict]]:
    """What :func:`measure` returns, as each prompt set's runs (the cached form)."""
    runs: dict[str, list[dict]] = {name: [] for name in sets}
    for (name, temperature, conc), res in measured.items():
        runs[name].append({"temperature": temperature, "concurrency": conc, **res})
    return runs


def store_cached(cache_dir, fps: dict[str, str], measured: dict[str, list[dict]]) -> None:
    """Keep each prompt set's runs under its fingerprint (``fps``) in ``cache_dir``."""
    for name, runs in measured.items():
        write_json(
            Path(cache_dir) / f"{fps[name]}.json",
            {"fingerprint": fps[name], "prompt_set": name, "runs": runs},
        )


def cache_fingerprints(
    prompt_files: dict[str, str], key: tuple[str | None, dict, dict]
) -> dict[str, str]:
    """Per prompt set, the fingerprint its measurement is cached under: ``key`` is (drafter
    identity or None, target, settings)."""
    drafter, target, settings = key
    return {
        name: set_fingerprint(drafter, target, path, settings)
        for name, path in prompt_files.items()
    }


def measure_cached(
    prompt_files: dict[str, str],
    cache_dir,
    key: tuple[str | None, dict, dict],
    measure_todo,
) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    """Per prompt set, its runs: from ``cache_dir`` where the set's fingerprint (of ``key``:
    drafter identity or None, target, settings; and the set's content) has an entry, else
    measured by ``measure_todo({name: prompts})`` (-> (runs per set, servers started)) and
    cached. Returns the runs and ``this_run`` (what was measured or reused)."""
    cache_dir = Path(cache_dir)
    fps = cache_fingerprints(prompt_files, key)
    by_set = {name: load_cached(cache_dir, fp) for name, fp in fps.items()}
    todo = {
        name: list(iter_jsonl(prompt_files[name])) for name, runs in by_set.items() if runs is None
    }
    log.info(
        "%d prompt set(s) cached (%s), %d to measure (%s)",
        len(by_set) - len(todo),
        ", ".join(n for n in by_set if n not in todo) or "none",
        len(todo),
        ", ".join(todo) or "none",
    )
    servers = 0
    if todo:
        measured, servers = measure_todo(todo)
        store_cached(cache_dir, fps, measured)
        by_set.update(measured)
    return by_set, {
        "servers_started": servers,
        "measured_sets": list(todo),
        "cached_sets": [n for n in by_set if n not in todo],
    }


def run_baseline(
    target_json,
    prompt_files: dict[str, str],
    out,
    cfg: dict,
    vllm_cfg: dict,
    cache_dir,
    log_path=None,
) -> dict:
    """Rule ``bench_baseline``: every prompt set without a drafter (one server), measured once
    for all methods and kept per set in ``cache_dir``. Writes the runs (throughput and, for
    the T=0 comparisons, the output token ids) to ``out``."""
    t0 = time.monotonic()
    target = load_info(target_json)
    key = baseline_key(target, cfg, vllm_cfg)

    def measure_todo(todo: dict[str, list[dict]]) -> tuple[dict[str, list[dict]], int]:
        what = "the baseline server (no drafter)"
        return measure_on_server(todo, cfg, vllm_cfg, target, None, what, log_path), 1

    by_set, this_run = measure_cached(prompt_files, cache_dir, key, measure_todo)
    baseline = {
        "sets": {
            name: {"prompts_sha256": sha256_file(prompt_files[name]), "runs": runs}
            for name, runs in by_set.items()
        },
        "settings": key[2],
        "this_run": this_run,
        "elapsed_s": round(time.monotonic() - t0, 1),
        "provenance": provenance(cfg, inputs=prompt_files),
    }
    write_json(out, baseline)
    return baseline


def drafter_rows(
    name: str, drafted: list[dict], baseline: dict, prompts_path, method: str
) -> list[dict]:
    """One prompt set's result rows: each drafter run next to the baseline run of the same
    temperature and concurrency (speedup; at T=0, the outputs compared token by token)."""
    entry = baseline["sets"].get(name)
    if entry is None or entry["prompts_sha256"] != sha256_file(prompts_path):
        raise BenchError(
            f"the baseline has no measurement of prompt set {name!r} as it is now: re-run "
            "bench_baseline"
        )
    base_runs = {(r["temperature"], r["concurrency"]): r for r in entry["runs"]}
    rows = []
    for res in drafted:
        base = base_runs.get((res["temperature"], res["concurrency"]))
        if base is None:
            raise BenchError(
                f"the baseline of {name!r} has no run at T={res['temperature']}, "
                f"concurrency {res['concurrency']}: re-run bench_baseline"
            )
        row = {
            "method": method,
            "prompt_set": name,
            "k": res["k"],
            "temperature": res["temperature"],
            "concurrency": res["concurrency"],
            "requests": res["requests"],
            **res["acceptance"],
            "tokens_per_s": res["tokens_per_s"],
            "baseline_tokens_per_s": base["tokens_per_s"],
            "speedup": res["tokens_per_s"] / base["tokens_per_s"],
            "latency_s": res["latency_s"],
            "baseline_latency_s": base["latency_s"],
            "output_tokens": res["output_tokens"],
            "baseline_output_tokens": base["output_tokens"],
        }
        if res["temperature"] == 0:
            row["outputs_vs_baseline"] = compare_outputs(base["outputs"], res["outputs"])
        rows.append(row)
    return rows


def run(
    target_json,
    drafter_dir,
    manifest_path,
    train_metrics,
    prompt_files: dict[str, str],
    baseline_json,
    metrics_out,
    cfg: dict,
    vllm_cfg: dict,
    cache_dir,
    log_path=None,
    name: str | None = None,
) -> dict:
    """Rule ``bench`` (one job per drafter): measure (or take from ``cache_dir``) the drafter
    on every prompt set, one server per k, put each run next to the shared baseline's, judge,
    write the metrics. The method and its limits come from the drafter's config; ``name`` (its
    name in train.methods, a method or a variant; default: the method) labels its rows."""
    target = load_info(target_json)
    manifest = read_json(manifest_path)
    drafter_dir = str(Path(drafter_dir).resolve())
    check = consistency.check(drafter_dir, manifest, target)
    if not check["ok"]:
        raise BenchError(
            "the drafter does not match this run's extraction/target:\n  - "
            + "\n  - ".join(check["problems"])
        )
    method = check["drafter"]["speculators_model_type"]
    block = check["drafter"].get("block_size")
    too_many = [k for k in cfg["num_speculative_tokens"] if block and k > block - 1]
    if too_many:
        raise BenchError(
            f"a {method} drafter of block size {block} drafts at most {block - 1} tokens; "
            f"bench.num_speculative_tokens asks for {too_many}"
        )
    prediction = read_json(train_metrics).get("prediction") or {}
    baseline = read_json(baseline_json)
    name = name or method
    t0 = time.monotonic()

    def measure_todo(todo: dict[str, list[dict]]) -> tuple[dict[str, list[dict]], int]:
        runs: dict[str, list[dict]] = {name: [] for name in todo}
        for k in cfg["num_speculative_tokens"]:
            spec_cfg = {"model": drafter_dir, "method": method, "num_speculative_tokens": k}
            what = f"the server with the {method} drafter (k={k})"
            measured = measure_on_server(todo, cfg, vllm_cfg, target, spec_cfg, what, log_path)
            for name, rows in measured.items():
                runs[name] += [{"k": k, **row} for row in rows]
        return runs, len(cfg["num_speculative_tokens"])

    key = drafter_key(drafter_dir, target, cfg, vllm_cfg)
    by_set, this_run = measure_cached(prompt_files, cache_dir, key, measure_todo)
    order = {
        "k": cfg["num_speculative_tokens"],
        "temperature": cfg["temperatures"],
        "concurrency": cfg["concurrency"],
        "prompt_set": list(prompt_files),
    }
    runs = sorted(
        (
            {
                **row,
                "predicted_acceptance_length": predicted_acceptance_length(prediction, row["k"]),
            }
            for set_name, drafted in by_set.items()
            for row in drafter_rows(set_name, drafted, baseline, prompt_files[set_name], name)
        ),
        key=lambda r: tuple(values.index(r[key]) for key, values in order.items()),
    )
    verdict = judge(runs, cfg)
    shorter = shorter_block_notes(block, cfg["num_speculative_tokens"])
    for note in shorter:
        log.warning("%s: NOT SERVED AS TRAINED at %s", name, note)
    metrics = {
        "method": name,
        "speculators_method": method,
        "runs": runs,
        "summary": summarize(runs),
        "verdict": verdict,
        "consistency": check,
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
    return metrics


def best_val(train_metrics: dict) -> dict:
    """Validation metrics of the exported (best) epoch, from the drafter's metrics.json."""
    epochs = [e for e in train_metrics.get("epochs", []) if e.get("val")]
    best = [e for e in epochs if e["epoch"] == train_metrics.get("best_epoch")]
    return (best or epochs[-1:] or [{}])[0].get("val", {})


def summarize(runs: list[dict]) -> dict[str, Any]:
    by_set: dict[str, dict] = {}
    for r in runs:
        if r["acceptance_length"] is None:
            continue
        s = by_set.setdefault(r["prompt_set"], {"acceptance_length": [], "speedup": []})
        s["acceptance_length"].append(r["acceptance_length"])
        s["speedup"].append(r["speedup"])
    return {
        name: {
            "best_acceptance_length": max(v["acceptance_length"]),
            "best_speedup": max(v["speedup"]),
        }
        for name, v in by_set.items()
    }


def judge(runs: list[dict], cfg: dict) -> dict[str, Any]:
    """The verdict on the drafter: every problem found, most severe first, and a headline.

    In order of severity: vLLM made no drafts (DRAFTER NOT USED); acceptance length about 1
    (DRAFTER NOT WORKING: untrained, or mis-wired); at T=0 on the held-out set, the measured
    acceptance far below the one training validation predicts (TRAIN/SERVE MISMATCH?); any
    measurement slower with the drafter than without it (SLOWER). The prediction is judged on
    the held-out set only: it comes from validation on the training distribution, which the
    held-out prompts are drawn from; a set far from it (another language, harder questions)
    is expected to score lower without anything being wrong.
    """
    problems: list[str] = []
    taus = [r["acceptance_length"] for r in runs if r["acceptance_length"] is not None]
    if not taus or any(r["drafts"] == 0 for r in runs):
        problems.append(
            "DRAFTER NOT USED: vLLM made no drafts; check the server log for how it loaded "
            "the drafter"
        )
        return {"ok": False, "message": problems[0], "problems": problems}
    worst = min(taus)
    if worst < cfg["min_acceptance_length"]:
        problems.append(
            f"DRAFTER NOT WORKING: acceptance length {worst:.2f} < "
            f"{cfg['min_acceptance_length']} (1.0 means every draft is rejected). Typical "
            "causes: untrained or undertrained drafter, or a train/serve mismatch (layer ids, "
            "vocab map, norms)."
        )
    for r in runs:
        pred, got = r.get("predicted_acceptance_length"), r["acceptance_length"]
        # The prediction comes from greedy validation accuracies: compare at T=0 only, and
        # where it is far enough above 1 for the ratio to mean something.
        if (
            r["prompt_set"] == HELDOUT_SET
            and r["temperature"] == 0
            and pred
            and pred >= 1.2
            and (got - 1) / (pred - 1) < cfg["min_measured_to_predicted"]
        ):
            problems.append(
                f"TRAIN/SERVE MISMATCH? held-out prompts (k={r['k']}): measured acceptance "
                f"length {got:.2f}, training validation predicts {pred:.2f}. Check the "
                "drafter's aux layer ids, vocab map, norms and sliding window against the "
                "target (report section 'Train/serve consistency')."
            )
            break
    slower = [r for r in runs if r["speedup"] is not None and r["speedup"] < 1]
    if slower:
        w = min(slower, key=lambda r: r["speedup"])
        where = f"at concurrency {w['concurrency']} on {w['prompt_set']}"
        if len({r["k"] for r in runs}) > 1 or len({r["temperature"] for r in runs}) > 1:
            where += f", k={w['k']}, T={w['temperature']}"
        problems.append(
            f"SLOWER: the drafter makes decoding slower ({w['speedup']:.2f}x {where}; "
            f"{len(slower)} of {len(runs)} measurements slower than without it)"
        )
    if problems:
        return {"ok": False, "message": problems[0], "problems": problems}
    speedups = [r["speedup"] for r in runs if r["speedup"] is not None]
    message = f"OK: acceptance length {worst:.2f}..{max(taus):.2f}"
    if speedups:
        message += f", speedup {min(speedups):.2f}x..{max(speedups):.2f}x"
    if not any(r["prompt_set"] == HELDOUT_SET for r in runs):
        message += " (no held-out set, prompts.heldout: 0: train/serve mismatch not judged)"
    return {"ok": True, "message": message, "problems": []}
