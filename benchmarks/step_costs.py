"""Step costs of speculative decoding at real targets' shapes (random weights), and the speedup
the measured τ would give there: a projection, not a measurement of speculative decoding.

    python benchmarks/step_costs.py --dummy-shape llama-8b kimi-k2-1l kimi-k2-2l --k 3 \
        --out step_costs.json

Per shape, in a process of its own (vLLM 0.26 offline ``LLM``, ``load_format="dummy"``, token
ids in and out, batch 1, prefix caching on, torch.compile and CUDA graphs of 1, 2, k + 1,
2(k + 1) and 8 tokens):
- target step: the same P-token prompt generated with ``max_tokens`` n and n + N (ignore_eos,
  T = 0); (t(n + N) - t(n)) / N, so prefill and request handling cancel;
- verify step of k + 1 tokens: after the P-token prefix is cached, requests of max_tokens 1
  whose uncached suffix has k + 1 tokens against ones whose suffix has 1 token, alternating;
  t_target + median(difference): a decode step plus what k more query tokens cost;
- drafter step: one EAGLE-3 drafter (one Llama decoder layer at the target's hidden size over
  [embedding; hidden state], the draft head of 32,000 tokens, the fc over 3 captured hidden
  states on the first of the k steps; layer shape as speculators derives it from the target)
  timed directly in torch as CUDA-graph replays with a KV cache of P tokens: the GPU time of
  the step, without vLLM's per-step scheduling;
- with --spec-engine: the whole speculative step as vLLM runs it, the target served with a
  random-weight EAGLE-3 drafter (k drafts a step; random drafts are next to never accepted,
  and vLLM's counters give the tokens a step emits), per token by the same difference as the
  target step.
The verify estimate runs k + 1 query tokens through the prefill path (piecewise graphs), not
the uniform-decode graph a speculative engine verifies with, so it overstates verification
where launches dominate (the 135M shape); the spec-engine step is the faithful one.
Each timing is repeated in --rounds rounds; medians, with min and max, are reported. Then
``eagle3_lab.step_costs.projections`` with the τ the bench stage measured on the 135M
target at concurrency 1 (--metrics), from the component sum and, where measured, from
vLLM's own step; for kimi-k2-1l + kimi-k2-2l the 61-layer extrapolation (1-layer cut + 60
marginal MoE layers) where the 2-layer cut measured slower.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eagle3_lab import dummy_models, step_costs
from eagle3_lab.results import write_result

REPO = Path(__file__).resolve().parents[1]
METRICS = REPO / "benchmarks/results/gpu_runs/gpu-rounds/bench/eagle3/metrics.json"


def rms(x, w, eps=1e-6):
    import torch

    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def drafter_times(layer: dict, context: int, device: str, rounds: int) -> dict:
    """Milliseconds of one EAGLE-3 drafter step (layer + head) and of its fc projection, each
    the median over ``rounds`` blocks of replays (CUDA graphs on a GPU, eager on the CPU)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    dt = torch.bfloat16
    h, nh, kvh, hd = (
        layer[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    )
    inter, vocab, dvocab = (
        layer["intermediate_size"],
        layer["vocab_size"],
        layer["draft_vocab_size"],
    )

    def w(*shape):  # random, never zeros: zeros can run faster than real data
        return (torch.randn(*shape, device=device, dtype=torch.float32) * 0.02).to(dt)

    p = {
        "embed": w(vocab, h),
        "fc": w(3 * h, h),
        "qkv": w(2 * h, (nh + 2 * kvh) * hd),
        "o": w(nh * hd, h),
        "gate_up": w(h, 2 * inter),
        "down": w(inter, h),
        "lm_head": w(h, dvocab),
        "n1": w(h) + 1,
        "n2": w(h) + 1,
        "n3": w(h) + 1,
        "n4": w(h) + 1,
    }
    kc = w(1, kvh, context, hd)
    vc = w(1, kvh, context, hd)
    cos, sin = w(1, 1, 1, hd) + 1, w(1, 1, 1, hd)
    pos = torch.tensor([context - 1], device=device)
    tok = torch.tensor([1], device=device)
    hidden = w(1, h)
    aux = w(1, 3 * h)

    def rope(x):
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat((-x2, x1), -1) * sin

    def layer_step():
        e = p["embed"][tok]
        x = torch.cat((rms(e, p["n1"]), rms(hidden, p["n2"])), -1)
        q, k, v = (x @ p["qkv"]).split([nh * hd, kvh * hd, kvh * hd], -1)
        q = rope(q.view(1, nh, 1, hd))
        kc.index_copy_(2, pos, rope(k.view(1, kvh, 1, hd)))
        vc.index_copy_(2, pos, v.view(1, kvh, 1, hd))
        a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=nh != kvh)
        o = a.reshape(1, nh * hd) @ p["o"] + hidden
        g, u = (rms(o, p["n3"]) @ p["gate_up"]).chunk(2, -1)
        d = (F.silu(g) * u) @ p["down"] + o
        return (rms(d, p["n4"]) @ p["lm_head"]).argmax(-1)

    def fc_step():
        return aux @ p["fc"]

    out = {}
    for name, fn in (("layer_step_ms", layer_step), ("fc_ms", fc_step)):
        out[name] = step_costs.summary(time_replays(fn, device, rounds))
    return out


def time_replays(fn, device: str, rounds: int, per_block: int = 100) -> list[float]:
    import torch

    if device != "cuda":
        per_block = 5
        fn()
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(per_block):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / per_block)
        return times
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(20):
        graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_block):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / per_block)
    return times


def make_llm(model_dir: Path, args, **extra):
    from vllm import LLM

    engine_args = json.loads(args.engine_args)
    if not engine_args.get("enforce_eager"):
        # batch 1 needs graphs of 1 token (decode) and k + 1 (verify); vLLM sizes its default
        # list by max_num_seqs, which is 1 here
        sizes = sorted({1, 2, args.k + 1, 2 * (args.k + 1), 8})
        engine_args.setdefault("compilation_config", {"cudagraph_capture_sizes": sizes})
    return LLM(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=args.prompt_tokens + args.decode_tokens + 64,
        max_num_seqs=1,
        enable_prefix_caching=True,
        seed=0,
        **extra,
        **engine_args,
    )


def runner(llm):
    """run(prompt ids, n): milliseconds to generate exactly n tokens (T = 0, no EOS stop)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def run(prompt, n):
        sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
        t = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)
        elapsed = time.perf_counter() - t
        assert len(out[0].outputs[0].token_ids) == n, "generated a different number of tokens"
        return elapsed * 1e3

    return run


def token_ids(vocab: int):
    import random

    rng = random.Random(0)
    return lambda n: [rng.randrange(100, min(vocab, 30000)) for _ in range(n)]


def decode_steps(run, ids, args) -> list[float]:
    """Per-token milliseconds, one per round: (t(n + N) - t(n)) / N on one cached prompt."""
    n_short, n_long = 2, 2 + args.decode_tokens
    prompt = ids(args.prompt_tokens)
    run(prompt, n_long)  # warm-up: caches the prompt, runs every graph once
    steps = []
    for r in range(args.rounds):
        pair = {}
        for n in (n_short, n_long) if r % 2 == 0 else (n_long, n_short):
            pair[n] = run(prompt, n)
        steps.append(step_costs.per_step(pair[n_long], pair[n_short], n_long, n_short))
    return steps


def engine_times(model_dir: Path, args, vocab: int) -> dict:
    """Target decode step and verify(k + 1) step in milliseconds (module docstring)."""
    t0 = time.monotonic()
    llm = make_llm(model_dir, args)
    start_s = time.monotonic() - t0
    run, ids = runner(llm), token_ids(vocab)
    decode = decode_steps(run, ids, args)
    prefix = ids(args.prompt_tokens)  # a multiple of the block size: cached whole
    run(prefix + ids(1), 1)
    many, one = [], []
    for r in range(args.rounds * args.verify_repeats):
        pair = {}
        for s in (1, args.k + 1) if r % 2 == 0 else (args.k + 1, 1):
            pair[s] = run(prefix + ids(s), 1)
        one.append(pair[1])
        many.append(pair[args.k + 1])
    t_decode = step_costs.summary(decode)["median"]
    verify = [step_costs.verify_step(t_decode, m, o) for m, o in zip(many, one, strict=True)]
    return {
        "engine_start_s": round(start_s, 1),
        "target_step_ms": step_costs.summary(decode),
        "verify_step_ms": step_costs.summary(verify),
        "request_1_uncached_ms": step_costs.summary(one),
        "request_k1_uncached_ms": step_costs.summary(many),
    }


def counter(llm, name: str) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == name)


def spec_engine_times(model_dir: Path, drafter_dir: Path, args, vocab: int) -> dict:
    """The whole speculative step as vLLM runs it: the target with the EAGLE-3 drafter (both
    random weights, k drafts a step), per-token time by the same difference as the target step,
    times the tokens a step emits (1 + accepted / drafts, from vLLM's counters)."""
    t0 = time.monotonic()
    llm = make_llm(
        model_dir,
        args,
        disable_log_stats=False,
        speculative_config={
            "method": "eagle3",
            "model": str(drafter_dir),
            "num_speculative_tokens": args.k,
        },
    )
    start_s = time.monotonic() - t0
    drafts0 = counter(llm, "vllm:spec_decode_num_drafts")
    accepted0 = counter(llm, "vllm:spec_decode_num_accepted_tokens")
    per_token = decode_steps(runner(llm), token_ids(vocab), args)
    drafts = counter(llm, "vllm:spec_decode_num_drafts") - drafts0
    accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens") - accepted0
    tokens_per_step = 1 + accepted / drafts if drafts else None
    return {
        "engine_start_s": round(start_s, 1),
        "per_token_ms": step_costs.summary(per_token),
        "drafts": drafts,
        "accepted": accepted,
        "tokens_per_step": tokens_per_step,
        "spec_step_ms": step_costs.summary([t * (tokens_per_step or 1) for t in per_token]),
    }


def worker(shape: str, args) -> dict:
    """One shape, measured in this process (its engine in vLLM's own child process)."""
    import torch

    if args.worker_mode == "spec":
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = dummy_models.write_config(shape, Path(tmp) / shape)
            drafter = dummy_models.write_eagle3_drafter(shape, Path(tmp) / "drafter")
            vocab = dummy_models.DUMMY_SHAPES[shape]["vocab_size"]
            return spec_engine_times(model_dir, drafter, args, vocab)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = dummy_models.DUMMY_SHAPES[shape]
    layer = dummy_models.eagle3_layer_config(cfg)
    res = {"shape": shape, "config": cfg, "drafter_layer": layer, "device": device}
    if device == "cuda":
        res["device_name"] = torch.cuda.get_device_name(0)
    res["drafter"] = drafter_times(layer, args.prompt_tokens, device, args.rounds * 4)
    if device == "cuda":  # the drafter's tensors went with its function: leave vLLM the GPU
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = dummy_models.write_config(shape, Path(tmp) / shape)
        res.update(engine_times(model_dir, args, cfg["vocab_size"]))
    return res


def costs_of(res: dict, k: int) -> dict:
    d = res["drafter"]
    costs = {
        "t_target_ms": res["target_step_ms"]["median"],
        "t_verify_ms": res["verify_step_ms"]["median"],
        "t_draft_ms": step_costs.draft_step(d["fc_ms"]["median"], d["layer_step_ms"]["median"], k),
    }
    spec = res.get("spec_engine", {})
    if "spec_step_ms" in spec:
        costs["t_spec_vllm_ms"] = spec["spec_step_ms"]["median"]
    return costs


def gpu_processes() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi: {e}"


def report(results: dict, args) -> dict:
    metrics = Path(args.metrics)
    runs = (
        step_costs.measured_runs(metrics, concurrency=1, temperature=args.temperature)
        if metrics.exists()
        else []
    )
    taus = {r["prompt_set"]: r["tau"] for r in runs if r["k"] == args.k}
    costs = {s: costs_of(r, args.k) for s, r in results.items() if "target_step_ms" in r}
    extrapolation = None
    if {"kimi-k2-1l", "kimi-k2-2l"} <= set(costs):
        one, two, layers = costs["kimi-k2-1l"], costs["kimi-k2-2l"], dummy_models.KIMI_K2_LAYERS
        try:
            costs[f"kimi-k2-{layers}l-extrapolated"] = {
                key: step_costs.extrapolate_layers(one[key], two[key], layers)
                for key in ("t_target_ms", "t_verify_ms")
            } | {"t_draft_ms": two["t_draft_ms"]}
        except ValueError as e:
            extrapolation = f"no {layers}-layer extrapolation: {e}"
    projections = {}
    for shape, c in costs.items():
        if not taus:
            break
        projections[shape] = {"components": step_costs.projections(c, taus, args.k)}
        if "t_spec_vllm_ms" in c:
            projections[shape]["vllm_spec_step"] = step_costs.projections_from_step(
                c["t_target_ms"], c["t_spec_vllm_ms"], taus
            )
        if shape == "smollm2-135m":  # the shape the τ was measured on: the measured speedup
            projections[shape]["measured"] = {r["prompt_set"]: r["speedup"] for r in runs}
    return {
        "what": "step costs at real targets' shapes with random weights; speedups are "
        "projections (eagle3_lab.step_costs.projected_speedup), not measurements",
        "formula": "speedup = tau * t_target / (t_verify(k+1) + k * t_draft)",
        "command": " ".join(sys.argv),
        "k": args.k,
        "prompt_tokens": args.prompt_tokens,
        "decode_tokens": args.decode_tokens,
        "rounds": args.rounds,
        "metrics": str(args.metrics),
        "temperature": args.temperature,
        "measured_135m_c1": runs,
        "tau": taus,
        "shapes": results,
        "costs_ms": costs,
        "projections": projections,
        "extrapolation": extrapolation,
    }


def run_worker(shape: str, mode: str, args) -> dict:
    """One shape in a child process (a fresh GPU for each engine); its JSON, or the error."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        argv = [
            sys.executable,
            __file__,
            *sys.argv[1:],
            "--worker",
            shape,
            "--worker-mode",
            mode,
            "--out",
            f.name,
        ]
        before = gpu_processes()
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, start_new_session=True)
        try:
            ok = proc.wait(timeout=args.timeout) == 0
        except subprocess.TimeoutExpired:
            ok = False
        # the engine's processes too, also after a clean exit: the next engine needs the GPU
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        res = (
            json.loads(Path(f.name).read_text())
            if ok
            else {"error": "worker failed or timed out (see its output)"}
        )
    res["gpu_processes_before"] = before
    res["wall_s"] = round(time.monotonic() - t0, 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dummy-shape", nargs="+", default=["llama-8b"], choices=sorted(dummy_models.DUMMY_SHAPES)
    )
    ap.add_argument(
        "--spec-engine",
        nargs="*",
        default=[],
        choices=sorted(dummy_models.DUMMY_SHAPES),
        help="also serve these shapes with a random EAGLE-3 drafter and time vLLM's "
        "whole speculative step (Llama shapes)",
    )
    ap.add_argument("--k", type=int, default=3, help="draft tokens per step")
    ap.add_argument(
        "--prompt-tokens", type=int, default=512, help="cached context (multiple of 16)"
    )
    ap.add_argument("--decode-tokens", type=int, default=128, help="N of the decode difference")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--verify-repeats", type=int, default=4, help="verify pairs per round")
    ap.add_argument("--engine-args", default="{}", help="JSON of extra vllm.LLM arguments")
    ap.add_argument(
        "--metrics",
        default=str(METRICS),
        help="bench metrics.json (or a lab/drafter_tau.py --speed file) with the measured τ",
    )
    ap.add_argument("--temperature", type=float, default=0.0, help="of the measured τ")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per engine")
    ap.add_argument("--from-json", help="recompute the derived figures of a saved --out file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-mode", default="engine", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.prompt_tokens % 16:
        ap.error("--prompt-tokens must be a multiple of 16 (vLLM caches whole blocks)")

    if args.from_json:  # same measurements, derived figures of this code
        saved = json.loads(Path(args.from_json).read_text())
        args.k = saved["k"]
        out = report(saved["shapes"], args) | {"command": saved["command"]}
        out["recomputed_by"] = " ".join(sys.argv)
        write_result(args.out, out)
        print_projections(out)
        return
    if args.worker:  # one shape; the parent reads its JSON
        Path(args.out).write_text(json.dumps(worker(args.worker, args), indent=1))
        return

    results = {}
    jobs = [(s, "engine") for s in args.dummy_shape] + [(s, "spec") for s in args.spec_engine]
    for shape, mode in jobs:
        res = run_worker(shape, mode, args)
        if mode == "engine":
            results[shape] = res | results.get(shape, {})
        else:
            results.setdefault(shape, {})["spec_engine"] = res
        out = report(results, args)
        if args.out:  # after every engine: a later failure keeps what finished
            write_result(args.out, out)
    print_projections(out)


def print_projections(out: dict) -> None:
    print(json.dumps(out["costs_ms"], indent=1))
    for shape, ways in out["projections"].items():
        for way, p in ways.items():
            if way == "measured":
                print(f"{shape} measured: " + ", ".join(f"{n} {v:.2f}x" for n, v in p.items()))
                continue
            print(
                f"{shape} ({way}): step {p['t_spec_ms']:.3f} ms, break-even τ "
                f"{p['break_even_tau']:.2f}, "
                + ", ".join(f"{n} {v:.2f}x" for n, v in p["speedup"].items())
                + " (projected)"
            )
    if out.get("extrapolation"):
        print(out["extrapolation"])


if __name__ == "__main__":
    main()
