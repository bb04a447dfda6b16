"""The report's content, as blocks that both renderers read: the verdict banners, benchmark
and side-by-side tables, training, consistency, and every stage's figures
(:func:`sections`)."""

from __future__ import annotations

from .. import methods
from ..bench.verdict import best_val
from ..prompts.selection import HELDOUT_SET
from .cells import fmt as _fmt
from .consistency import consistency as _consistency

# ---- content ----------------------------------------------------------------------------------

VERDICT_NOTE = (
    "τ = 1 + accepted / drafts from vLLM's spec-decode counters; τ predicted from validation: "
    "1 + Σ_i Π_{{j≤i}} a_j over EAGLE-3's conditional accuracies per TTT step; for DFlash its "
    "expected accepted length (eal) over the block when k = block size - 1, else the same sum "
    "over its per-position accuracies (an estimate). The accuracies score a draft against the "
    "target's argmax, which is what greedy decoding accepts: the prediction is given at T = 0 "
    "only (at T > 0 a draft is accepted with the target's probability of it, and τ is lower by "
    "how unsure the target is). It comes from validation on "
    "the training distribution, so it is judged on the held-out set ('{heldout}': prompts taken "
    "out of the training pool, never trained on) only: there a measured τ far below it points "
    "at a train/serve mismatch. Other sets are shown with it for reference; a set far from the "
    "training prompts (another language, harder questions) is expected to score lower. Speedup "
    "= tok/s with the drafter / tok/s without it: the median over the rounds (bench.rounds), "
    "each a pass over the whole prompt set, with its min–max in brackets. With bench.pairing "
    "alternate the baseline server runs beside the drafter's and the rounds alternate between "
    "them (the speedup is paired per round); with separate one baseline is measured for every "
    "method and the range allows for every combination of rounds. ~ marks a speedup whose "
    "range crosses 1: within noise. The verdict calls a drafter OK only where every round of "
    "every measurement was faster with it, in at least two rounds (one round cannot tell a "
    "speedup from noise: ONE ROUND), with the machine to itself (no other process on the GPU, "
    "at most a quarter of the bench's cores used by other processes), and, in float32, with "
    "every output at T = 0 equal to the target's own."
)


def _speedup_cell(r: dict) -> str:
    """'0.84x (0.81–0.86)', '~' appended when the range crosses 1; '0.84x' for one round."""
    cell = f"{_fmt(r['speedup'])}x"
    lo_hi = r.get("speedup_range")
    if r.get("rounds", 1) > 1 and lo_hi:
        cell += f" ({lo_hi[0]:.2f}–{lo_hi[1]:.2f})"
        if r.get("significance") == "within noise":
            cell += " ~"
    return cell


def _benchmark(methods: dict[str, dict]) -> list:
    blocks: list = []
    rows = []
    for method, m in methods.items():
        verdict = m["bench"].get("verdict", {})
        prefix = f"{method}: " if len(methods) > 1 else ""
        blocks.append(
            ("banner", verdict.get("ok", False), prefix + verdict.get("message", "no verdict"))
        )
        blocks += [("banner", False, prefix + p) for p in verdict.get("problems", [])[1:]]
        blocks += [("p", prefix + note) for note in verdict.get("notes", [])]
        blocks += _gate(prefix, m["bench"].get("gate"))
        for r in m["bench"].get("runs", []):
            ovb = r.get("outputs_vs_baseline")
            rows.append(
                [
                    method,
                    f"{HELDOUT_SET} (never trained on)"
                    if r["prompt_set"] == HELDOUT_SET
                    else r["prompt_set"],
                    r["k"],
                    r["temperature"],
                    r["concurrency"],
                    _fmt(r["acceptance_length"]),
                    _fmt(r.get("predicted_acceptance_length")),
                    " / ".join(_fmt(p, 2) for p in (r["per_position"] or [])),
                    _fmt(r["tokens_per_s"]),
                    _fmt(r["baseline_tokens_per_s"]),
                    _speedup_cell(r),
                    f"{ovb['differing']}/{ovb['compared']}" if ovb else "–",
                ]
            )
    header = [
        "method",
        "prompt set",
        "k",
        "T",
        "conc.",
        "τ measured",
        "τ predicted",
        "acceptance per position",
        "tok/s drafter",
        "tok/s baseline",
        "speedup (min–max)",
        "outputs differing (T=0)",
    ]
    return [
        *blocks,
        ("table", header, rows),
        ("p", VERDICT_NOTE.format(heldout=HELDOUT_SET)),
        ("img", "acceptance_length"),
        ("img", "acceptance_per_position"),
        ("img", "throughput"),
    ]


def _gate(prefix: str, gate: dict | None) -> list:
    """The regression gate (bench.gate): its headline and every check against its floor. Only
    a gate that passed reaches the report: a failed one fails the bench job."""
    if not gate:
        return []
    rows = [
        [
            c["prompt_set"],
            c["k"],
            c["temperature"],
            c["concurrency"],
            c["what"],
            _fmt(c["measured"]),
            _fmt(c["floor"]),
            "yes" if c["ok"] else "NO",
        ]
        for c in gate["checks"]
    ]
    header = ["prompt set", "k", "T", "conc.", "gate check", "measured", "floor", "passed"]
    passed = sum(c["ok"] for c in gate["checks"])
    headline = (
        f"GATE {'PASSED' if gate['passed'] else 'FAILED'}: {passed} of {len(rows)} checks at "
        "or above their floors (bench.gate)"
    )
    return [("banner", gate["passed"], prefix + headline), ("table", header, rows)]


def _drafter_shape(train: dict) -> str:
    """Draft layers and what they draft, from the trainer fields of the drafter's training."""
    t = (train.get("config") or {}).get("trainer") or {}
    if not t:
        return "–"
    return methods.get(t.get("speculator_type")).shape(t)


def _side_by_side(methods: dict[str, dict]) -> list:
    """One row per method and k: what it is, what training cost, and per prompt set its τ and
    speedup (first temperature and concurrency measured)."""
    sets: list[str] = []
    for m in methods.values():
        sets += [r["prompt_set"] for r in m["bench"].get("runs", []) if r["prompt_set"] not in sets]
    rows = []
    for method, m in methods.items():
        runs = m["bench"].get("runs", [])
        first = (runs[0]["temperature"], runs[0]["concurrency"]) if runs else None
        for k in dict.fromkeys(r["k"] for r in runs):
            at = {
                r["prompt_set"]: r
                for r in runs
                if r["k"] == k and (r["temperature"], r["concurrency"]) == first
            }
            train = m["train"]
            rows.append(
                [
                    method,
                    _drafter_shape(train),
                    k,
                    _fmt(train.get("wall_s"), 3),
                    _fmt((train.get("throughput") or {}).get("tokens_per_s")),
                    *(
                        f"{_fmt(at[s]['acceptance_length'])} / {_speedup_cell(at[s])}"
                        if s in at
                        else "–"
                        for s in sets
                    ),
                ]
            )
    note = (
        "Each method's drafter is trained from the same prepared rows, draft vocabulary and "
        "hidden states and benchmarked on the same prompts against the target without a "
        "drafter. Cells: τ measured / speedup (median, min–max over the rounds)"
    )
    if rows and methods:
        any_run = next(
            (m["bench"]["runs"][0] for m in methods.values() if m["bench"].get("runs")), None
        )
        if any_run:
            note += f" at T={any_run['temperature']}, concurrency {any_run['concurrency']}"
    header = ["method", "drafter", "k", "training time (s)", "training tok/s", *sets]
    return [("table", header, rows), ("p", note + ".")]


def _training(name: str, train: dict) -> list:
    """Drafter ``name``'s training (a method's or a variant's: its metrics say which method)."""
    own = methods.get(train.get("method"))
    val = best_val(train)
    tp = train.get("throughput") or {}
    epochs = f"{len(train.get('epochs', []))} (epoch {_fmt(train.get('best_epoch'))})"
    acc = lambda xs: " / ".join(_fmt(x, 3) for x in xs or [])  # noqa: E731
    series = own.accuracy_series
    per = own.position_label
    val_rows = [
        [f"validation {field.replace('_', ' ')} per {per}", acc(val.get(field))]
        for field, _ in series
    ]
    if "eal" in val:
        val_rows.append(["validation expected accepted length (eal)", _fmt(val.get("eal"))])
    return [
        (
            "table",
            ["", ""],
            [
                ["drafter", _drafter_shape(train)],
                [f"epochs (exported: best by {train.get('best_by', 'validation loss')})", epochs],
                ["validation loss", _fmt(val.get("loss"))],
                *val_rows,
                ["training tokens/s", _fmt(tp.get("tokens_per_s"))],
                ["loader wait share of step time", _fmt(tp.get("loader_wait_fraction"))],
                ["wall time (s)", _fmt(train.get("wall_s"))],
            ],
        ),
        (
            "table",
            ["epoch", "train loss", "val loss", *(f"val {f.replace('_', ' ')}" for f, _ in series)],
            [
                [
                    e["epoch"],
                    _fmt(e["train"]["loss"]),
                    _fmt((e.get("val") or {}).get("loss")),
                    *(acc((e.get("val") or {}).get(f)) for f, _ in series),
                ]
                for e in train.get("epochs", [])
            ],
        ),
        ("img", f"train_{name}"),
    ]


def sections(d: dict[str, dict]) -> list[tuple[str, list]]:
    """Report content as (title, blocks); a block is ("p", text), ("table", header, rows),
    ("img", key) or ("banner", ok, text). ``d["methods"]`` maps each drafter method to its
    ``{"bench": bench metrics, "train": train metrics}``; the other keys are the stages'."""
    synth, manifest = d["synth"], d["manifest"]
    vocab, prompts, prepare = d["vocab"], d["prompts"], d["prepare"]
    methods = d["methods"]
    out: list[tuple[str, list]] = [("Benchmark", _benchmark(methods))]
    if len(methods) > 1:
        out.append(("Methods side by side", _side_by_side(methods)))
    out.append(("Train/serve consistency", _consistency(methods)))

    tc = synth.get("template_check", {})
    out.append(
        (
            "Synthetic data",
            [
                (
                    "table",
                    ["", ""],
                    [
                        [
                            "samples ok / prompts",
                            f"{_fmt(synth.get('samples_ok'))} / {_fmt(synth.get('prompts'))}",
                        ],
                        [
                            "failed or rejected",
                            _fmt(synth.get("samples_failed"))
                            if synth.get("samples_failed")
                            else "0",
                        ],
                        [
                            "prompt / completion tokens",
                            f"{_fmt(synth.get('prompt_tokens'))} / "
                            f"{_fmt(synth.get('completion_tokens'))}",
                        ],
                        ["finish reasons", _fmt(synth.get("finish_reasons"))],
                        ["reasoning capture rate", _fmt(synth.get("reasoning_capture_rate"))],
                        ["template check: text mismatches", _fmt(tc.get("text_mismatches"))],
                        [
                            "template check: same text, other tokens",
                            _fmt(tc.get("tokenization_only")),
                        ],
                        [
                            "generation tokens/s (all runs that generated)",
                            _fmt((synth.get("generation") or {}).get("completion_tokens_per_s")),
                        ],
                    ],
                ),
                (
                    "table",
                    [
                        "prompt source",
                        "use",
                        "rows read",
                        "usable",
                        "skipped (bad)",
                        "duplicates",
                        "sampled",
                    ],
                    [
                        [
                            name,
                            use,
                            _fmt(s.get("rows_read")),
                            _fmt(s.get("kept")),
                            ", ".join(f"{k} {v}" for k, v in (s.get("skipped") or {}).items() if v)
                            or "0",
                            _fmt(s.get("duplicates")),
                            _fmt(s.get("sampled")),
                        ]
                        for use in ("train", "bench")
                        for name, s in (prompts.get(use) or {}).items()
                    ],
                ),
            ],
        )
    )

    out.append(
        (
            "Training rows and vocabulary",
            [
                (
                    "table",
                    ["", ""],
                    [
                        [k, _fmt(v)]
                        for k, v in prepare.items()
                        if k not in ("provenance",) and not isinstance(v, dict)
                    ],
                ),
                (
                    "table",
                    ["", ""],
                    [[k, _fmt(v)] for k, v in vocab.items() if k not in ("provenance",)],
                ),
                ("img", "vocab"),
            ],
        )
    )

    v = manifest.get("verification", {})
    if not manifest:  # extract.mode online/hybrid: each train job extracted for itself
        out.append(("Hidden-state extraction (inside training)", _online_extraction(methods)))
    else:
        out.append(_stored_extraction(manifest, v))

    for method, m in methods.items():
        out.append(
            (
                f"Training: {method}" if len(methods) > 1 else "Training",
                _training(method, m["train"]),
            )
        )

    prov_rows = []
    stages = {
        name: d.get(name) for name in ("target", "prompts", "synth", "prepare", "vocab", "manifest")
    }
    for method, m in methods.items():
        stages[f"train {method}"], stages[f"bench {method}"] = m["train"], m["bench"]
    for name, data in stages.items():
        p = (data or {}).get("provenance") or {}
        if p:
            prov_rows.append(
                [name, p.get("config_hash"), (p.get("code") or {}).get("git"), p.get("created")]
            )
    benches = [m["bench"] for m in methods.values()]
    pk = next(
        (
            b["provenance"]["packages"]
            for b in benches
            if (b.get("provenance") or {}).get("packages")
        ),
        {},
    )
    out.append(
        (
            "Provenance",
            [
                ("table", ["stage", "config hash", "code (git describe)", "created"], prov_rows),
                ("table", ["package", "version"], [[k, v] for k, v in sorted(pk.items())]),
            ],
        )
    )
    return out


def _stored_extraction(manifest: dict, v: dict) -> tuple[str, list]:
    """The extract stage's manifest: samples, layers, storage and its checks."""
    return (
        "Hidden-state extraction",
        [
            (
                "table",
                ["", ""],
                [
                    [
                        "samples / tokens",
                        f"{_fmt(manifest.get('num_samples'))} / {_fmt(manifest.get('tokens'))}",
                    ],
                    ["layers (aux + final)", _fmt(manifest.get("layer_ids"))],
                    [
                        "storage, bytes per token",
                        f"{manifest.get('storage')}, {_fmt(manifest.get('bytes_per_token'))}",
                    ],
                    [
                        "next-token agreement",
                        _fmt(v.get("next_token_agreement"), 4)
                        + f" over {_fmt(v.get('next_token_positions'))} positions",
                    ],
                    [
                        "reference forward: max relative error",
                        _fmt(v.get("reference_max_rel_error")),
                    ],
                    ["reference error per layer", _fmt(v.get("reference_per_layer"))],
                    [
                        "extraction tokens/s (per part, last run)",
                        _fmt(
                            [p["this_run"].get("tokens_per_s") for p in manifest.get("parts", [])]
                        ),
                    ],
                ],
            ),
        ],
    )


def _online_extraction(methods: dict) -> list:
    """extract.mode online/hybrid: what each train job's own extraction fed it and how the
    samples checked (metrics.json ``hidden_states``)."""
    rows = []
    for method, m in methods.items():
        hs = m["train"].get("hidden_states") or {}
        v = hs.get("verification") or {}
        rows.append(
            [
                method,
                hs.get("mode"),
                _fmt(hs.get("layer_ids")),
                hs.get("storage"),
                f"{_fmt(v.get('samples_generated'))} / {_fmt(v.get('samples_from_disk'))}",
                _fmt(v.get("next_token_agreement"), 4)
                + f" over {_fmt(v.get('next_token_positions'))} positions",
                f"{_fmt(v.get('kept_bytes'))} / {_fmt(v.get('largest_sample_bytes'))}",
            ]
        )
    header = [
        "drafter",
        "mode",
        "layers (aux + final)",
        "storage",
        "samples generated / read from disk",
        "next-token agreement",
        "bytes kept / largest sample",
    ]
    return [("table", header, rows)]
