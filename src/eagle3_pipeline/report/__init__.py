"""The run's report: one self-contained HTML page (plots inlined) and a Markdown twin.

Reads every stage's stats and manifest, draws the benchmark plots, and puts the verdict on
top: a drafter that does not work (tau ~ 1) or slows decoding is announced in red, never left
to a table. With several drafter methods, their benchmarks, training and consistency records
stand side by side.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..runtime.files import atomic_path, read_json
from ..runtime.results import BENCH_METRICS, TRAIN_METRICS, read_result
from .plots import plot_bench
from .render import render_html, render_markdown
from .sections import sections

__all__ = ["build", "plot_bench", "render_html", "render_markdown", "sections"]

log = logging.getLogger(__name__)


def build(
    inputs: dict[str, str],
    methods: dict[str, dict[str, str]],
    html_out,
    markdown_out,
    plots_dir,
    run_name: str,
    bench_prompt_stats: list[str] = (),
) -> None:
    """``inputs`` names each stage's JSON output (and the vocab plot); ``methods`` maps each
    drafter method to its ``{"train": metrics.json, "train_plot": loss.png, "bench":
    metrics.json}``; ``bench_prompt_stats`` are the stats files of the benchmark prompt sets,
    merged into the prompts section."""
    data = {name: read_json(path) for name, path in inputs.items() if str(path).endswith(".json")}
    if "prompts" in data:
        data["prompts"]["bench"] = {
            name: st for path in bench_prompt_stats for name, st in read_json(path)["bench"].items()
        }
    for name in ("synth", "manifest", "vocab", "prompts", "prepare", "target"):
        data.setdefault(name, {})
    data["methods"] = {
        m: {
            "train": read_result(paths["train"], TRAIN_METRICS),
            "bench": read_result(paths["bench"], BENCH_METRICS),
        }
        for m, paths in methods.items()
    }
    plots_dir = Path(plots_dir)
    runs = [r for m in data["methods"].values() for r in m["bench"].get("runs", [])]
    images = plot_bench(runs, plots_dir)
    images["vocab"] = Path(inputs["vocab_plot"]) if "vocab_plot" in inputs else None
    for m, paths in methods.items():
        images[f"train_{m}"] = Path(paths["train_plot"])
    title = f"Drafter report ({', '.join(methods)}): run {run_name}"
    content = sections(data)
    with atomic_path(html_out) as tmp:
        tmp.write_text(render_html(title, content, images))
    with atomic_path(markdown_out) as tmp:
        tmp.write_text(render_markdown(title, content, images, Path(markdown_out).parent))
    log.info("report: %s", html_out)
