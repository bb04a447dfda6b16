"""How the bench stage measures: one pass of a prompt set on a server, acceptance from vLLM's
spec-decode counters, and the rounds protocol.

A *pass* sends every prompt of a set at one temperature and concurrency and times the whole
set (output tokens / wall time). A *cell* is one (prompt set, temperature, concurrency); it is
measured in ``rounds`` passes per server. With two servers up at once (baseline and drafter,
``bench.pairing: alternate``) the passes of a cell alternate between them and the order
switches every round (baseline first in even rounds, drafter first in odd ones), so a drift of
the machine (clocks, caches, a neighbour) lands on both sides alike; each round gives one
paired speedup. Acceptance (tau, per position) is counted over every round of the cell.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..prompts.rows import LATER_TURNS
from ..runtime import for_each
from ..runtime.gpus import nvidia_smi_rows
from ..server import client as client_lib
from ..stats import percentiles

# bench.rounds: auto (decided here, in the bench stage's logic, so that changing it re-runs
# the bench jobs): speed on a GPU needs several rounds to show its spread; on the CPU one
# round keeps the embedded default short (its speeds are noisy either way).
AUTO_ROUNDS = {"cuda": 3, "cpu": 1}


def bench_rounds(bench_cfg: dict, vllm_cfg: dict) -> int:
    """How many rounds each bench measurement takes (``bench.rounds``, auto resolved)."""
    rounds = bench_cfg["rounds"]
    return AUTO_ROUNDS[vllm_cfg["device"]] if rounds == "auto" else int(rounds)


log = logging.getLogger(__name__)

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

BASELINE, DRAFTER = "baseline", "drafter"


class BenchError(RuntimeError):
    pass


# ---- acceptance from the Prometheus counters ------------------------------------------------


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


def counter_delta(before: dict, after: dict) -> dict[str, Any]:
    """The counts between two scrapes."""
    return {
        "drafts": int(after[SPEC_COUNTERS[0]] - before[SPEC_COUNTERS[0]]),
        "draft_tokens": int(after[SPEC_COUNTERS[1]] - before[SPEC_COUNTERS[1]]),
        "accepted": int(after[SPEC_COUNTERS[2]] - before[SPEC_COUNTERS[2]]),
        "accepted_per_position": [
            int(after[PER_POS][p] - before[PER_POS].get(p, 0.0)) for p in sorted(after[PER_POS])
        ],
    }


def acceptance(counts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Acceptance over one or more passes' counts (:func:`counter_delta`): tau = 1 +
    accepted / drafts, per-position acceptance = accepted at the position / drafts."""
    counts = list(counts)
    drafts = sum(c["drafts"] for c in counts)
    draft_tokens = sum(c["draft_tokens"] for c in counts)
    accepted = sum(c["accepted"] for c in counts)
    n_pos = max((len(c["accepted_per_position"]) for c in counts), default=0)
    per_pos = [
        sum(c["accepted_per_position"][p] for c in counts if p < len(c["accepted_per_position"]))
        for p in range(n_pos)
    ]
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted": accepted,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "per_position": [a / drafts if drafts else None for a in per_pos],
    }


# ---- one pass of a prompt set ----------------------------------------------------------------


def request_body(prompt: dict, model: str, i: int, temperature: float, cfg: dict) -> dict:
    body = {
        "model": model,
        "messages": prompt["messages"],
        "max_tokens": cfg["max_tokens"],
        "temperature": temperature,
        "seed": 1234 + i,
        "return_token_ids": True,
    }
    if cfg.get("chat_template_kwargs"):  # e.g. a thinking target measured in thinking mode
        body["chat_template_kwargs"] = cfg["chat_template_kwargs"]
    return body


async def _pass(
    base_url: str, model: str, prompts: list[dict], temperature: float, concurrency: int, cfg: dict
) -> dict[str, Any]:
    import openai

    results: list[dict | None] = [None] * len(prompts)

    async def go(client, i: int) -> None:
        # a row with later turns is a conversation: each turn asked after this server's own
        # answer to the ones before it; its figures cover every turn
        t0, messages, token_ids, tokens = time.monotonic(), list(prompts[i]["messages"]), [], 0
        answer = ""
        for turn, user in enumerate([None, *prompts[i].get(LATER_TURNS, ())]):
            if user is not None:
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": user},
                ]
            body = request_body({"messages": messages}, model, i, temperature, cfg)
            try:
                data = await client_lib.chat(client, body)
            except openai.APIError as e:
                raise BenchError(
                    f"request {i} (prompt {prompts[i].get('id')!r}"
                    + (f", turn {turn + 1}" if turn else "")
                    + f") failed: {type(e).__name__}: {str(e)[:300]}"
                ) from e
            choice = data["choices"][0]
            answer = choice["message"].get("content") or ""
            token_ids += choice.get("token_ids") or []
            tokens += data["usage"]["completion_tokens"]
        results[i] = {"latency_s": time.monotonic() - t0, "token_ids": token_ids, "tokens": tokens}

    # No retries: a retried request would distort the timing; a failure is an error.
    client = client_lib.async_client(base_url, timeout=cfg["request_timeout_s"], max_retries=0)
    async with client:
        t0 = time.monotonic()
        await for_each(range(len(prompts)), lambda i: go(client, i), concurrency)
        wall = time.monotonic() - t0
    tokens = sum(r["tokens"] for r in results)
    return {
        "requests": sum(1 + len(p.get(LATER_TURNS, ())) for p in prompts),
        "output_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall else None,
        "latencies_s": [r["latency_s"] for r in results],
        "outputs": [r["token_ids"] for r in results],
    }


def one_pass(
    server, prompts: list[dict], temperature: float, concurrency: int, cfg: dict, spec: bool
) -> dict[str, Any]:
    """One timed pass of ``prompts`` on ``server``; with ``spec``, its spec-decode counts."""
    before = scrape(server.base_url) if spec else None
    res = asyncio.run(
        _pass(server.base_url, server.model_name, prompts, temperature, concurrency, cfg)
    )
    if spec:
        res["counts"] = counter_delta(before, scrape(server.base_url))
    return res


def warm_up(server, prompts: list[dict], cfg: dict) -> None:
    """Short requests first, so that warm-up costs (first-request compilation, allocator
    growth) land outside the measured passes."""
    asyncio.run(
        _pass(server.base_url, server.model_name, prompts[:2], 0.0, 2, dict(cfg, max_tokens=8))
    )


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


# ---- what else is on the machine ------------------------------------------------------------


def _gpu_processes() -> list[dict[str, Any]] | None:
    """Compute processes on the GPUs (nvidia-smi), None where there is no nvidia-smi."""
    try:
        rows = nvidia_smi_rows("compute-apps=pid,process_name,used_memory")
    except (OSError, subprocess.SubprocessError) as e:
        return [{"error": f"nvidia-smi failed: {e}"}]
    if rows is None:
        return None
    procs = []
    for parts in rows:
        if len(parts) == 3 and parts[0].isdigit():
            procs.append({"pid": int(parts[0]), "name": parts[1], "memory_mib": parts[2]})
    return procs


def _process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (OSError, ProcessLookupError):
        return None


def _cpu_ticks(cpus: set[int], groups: set[int]) -> dict[str, int] | None:
    """Clock ticks since boot of the cores ``cpus`` (busy and in all, from /proc/stat) and of
    the bench's own processes: this one and those of the process ``groups`` (its servers);
    None where there is no /proc (not Linux)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if name[3:].isdigit() and name.startswith("cpu") and int(name[3:]) in cpus:
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, fields[:8])
            busy += user + nice + system + irq + softirq + steal
            total += user + nice + system + idle + iowait + irq + softirq + steal
    ours = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # after the command name (which may hold spaces): state, ppid, pgrp, ... utime,
            # stime (fields 14 and 15 of proc(5))
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) in groups or stat.parent.name == str(os.getpid()):
            ours += int(fields[11]) + int(fields[12])
    return {"busy": busy, "total": total, "ours": ours}


def other_cpu_share(before: dict | None, after: dict | None) -> float | None:
    """The share of the cores' time between two :func:`_cpu_ticks` that processes other than
    the bench's used; None where either is unknown."""
    if not before or not after or after["total"] <= before["total"]:
        return None
    others = (after["busy"] - before["busy"]) - (after["ours"] - before["ours"])
    return round(max(others, 0) / (after["total"] - before["total"]), 3)


def surroundings(servers: Iterable, since: dict | None = None) -> dict[str, Any]:
    """What shares the machine with the measurement: GPU compute processes that belong to none
    of ``servers`` (each runs in a process group of its own), the 1-minute load average, the
    cores this process may run on, and their clock ticks (:func:`_cpu_ticks`). With ``since``
    (the surroundings at the start of a measurement): ``other_cpu_share``, the share of the
    cores' time in between that other processes than the bench's (this one, its servers) used.
    The load average alone cannot say that: it counts the bench's own servers (on the CPU
    vLLM keeps every core busy by itself) and trails a measurement by a minute."""
    groups = {_process_group(s.proc.pid) for s in servers if getattr(s, "proc", None)}
    groups.discard(None)
    gpu = _gpu_processes()
    others = None
    if gpu is not None:
        others = [p for p in gpu if "pid" not in p or _process_group(p["pid"]) not in groups]
    cpus = os.sched_getaffinity(0)
    env = {
        "other_gpu_processes": others,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": len(cpus),
        "cpu_ticks": _cpu_ticks(cpus, groups),
    }
    if since is not None:
        env["other_cpu_share"] = other_cpu_share(since.get("cpu_ticks"), env["cpu_ticks"])
    return env


# ---- the rounds protocol ---------------------------------------------------------------------


def round_order(r: int) -> tuple[str, str]:
    """Which server goes first in round ``r``: the baseline in even rounds, the drafter in odd
    ones (a drift over the cell's time then favours neither)."""
    return (BASELINE, DRAFTER) if r % 2 == 0 else (DRAFTER, BASELINE)


def _log_pass(what: str, name: str, t: float, c: int, r: int, res: dict) -> None:
    tau = ""
    if "counts" in res:
        tau = f", tau {acceptance([res['counts']])['acceptance_length']}"
    log.info(
        "%s %s T=%s c=%d round %d: %.1f tok/s%s", what, name, t, c, r, res["tokens_per_s"], tau
    )


def _slim(res: dict, keep_outputs: bool) -> dict:
    """A pass as it is kept: without its outputs except where they are compared."""
    return {k: v for k, v in res.items() if keep_outputs or k != "outputs"}


SetDone = Callable[[str, list[dict]], None]


def _measure_cells(
    sets: Mapping[str, list[dict]],
    cfg: dict,
    rounds: int,
    servers: list,
    measure_round: Callable[[str, float, int, int], dict],
    done: SetDone | None,
) -> dict[str, list[dict]]:
    """Per prompt set, one entry per (temperature, concurrency), the cells, measured set by
    set: each cell's rounds (``measure_round(set, T, c, r)``) and the surroundings before and
    after them. ``done(set, entries)`` is called as each set is complete."""
    out: dict[str, list[dict]] = {name: [] for name in sets}
    for name in sets:
        for t in cfg["temperatures"]:
            for c in cfg["concurrency"]:
                env_before = surroundings(servers)
                entry = [measure_round(name, t, c, r) for r in range(rounds)]
                out[name].append(
                    {
                        "temperature": t,
                        "concurrency": c,
                        "rounds": entry,
                        "surroundings": [env_before, surroundings(servers, since=env_before)],
                    }
                )
        if done is not None:
            done(name, out[name])
    return out


def measure_alternating(
    servers: Mapping[str, Any],
    sets: Mapping[str, list[dict]],
    cfg: dict,
    rounds: int,
    done: SetDone | None = None,
) -> dict[str, list[dict]]:
    """Per prompt set, one entry per (temperature, concurrency): the cell's ``rounds`` rounds,
    each a pass on the baseline and on the drafter server in :func:`round_order`. Outputs are
    kept from round 0 (compared at T=0). ``done(set, entries)``: called as each set is
    complete, so that a failure later on loses only the set at hand."""
    first = next(iter(sets.values()))
    for server in servers.values():
        warm_up(server, first, cfg)

    def measure_round(name: str, t: float, c: int, r: int) -> dict:
        order = round_order(r)
        passes = {}
        for who in order:
            res = one_pass(servers[who], sets[name], t, c, cfg, spec=who == DRAFTER)
            _log_pass(who, name, t, c, r, res)
            passes[who] = _slim(res, keep_outputs=r == 0)
        return {"order": list(order), **passes}

    return _measure_cells(sets, cfg, rounds, list(servers.values()), measure_round, done)


def measure_rounds(
    server,
    sets: Mapping[str, list[dict]],
    cfg: dict,
    rounds: int,
    who: str,
    done: SetDone | None = None,
) -> dict[str, list[dict]]:
    """Per prompt set, one entry per (temperature, concurrency): ``rounds`` passes on one
    server (``who``: baseline or drafter), back to back (``bench.pairing: separate``);
    ``done`` as for :func:`measure_alternating`."""
    warm_up(server, next(iter(sets.values())), cfg)

    def measure_round(name: str, t: float, c: int, r: int) -> dict:
        res = one_pass(server, sets[name], t, c, cfg, spec=who == DRAFTER)
        _log_pass(who, name, t, c, r, res)
        return {"order": [who], who: _slim(res, keep_outputs=r == 0)}

    return _measure_cells(sets, cfg, rounds, [server], measure_round, done)


def latency(passes: Iterable[dict]) -> dict[str, float]:
    """Request latency percentiles over every request of ``passes``."""
    return percentiles([x for p in passes for x in p["latencies_s"]], (50, 100))
