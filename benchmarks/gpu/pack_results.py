"""Pack what a GPU host run measured into one archive small enough to bring home.

    python3 benchmarks/gpu/pack_results.py /tmp/w $OUT/h200-results.tar.xz

Takes every run's figures, plots, reports, configs of the drafters, Snakemake's job
benchmarks and logs (logs cut to their last MiB), the efficiency benchmarks' JSON and the plan's
status; leaves out the bulk (hidden states, datasets, model weights, synth records). The archive
must stay under the 16 MiB a remote command may return per file.
"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

KEEP = [
    "status.log",
    "plan.log",
    "bench/*.json",
    "bench/*.txt",
    "logs/*.log",
    "repo/results/*/target/target.json",
    "repo/results/*/prompts/*.json",
    "repo/results/*/synth/stats.json",
    "repo/results/*/prepare/stats.json",
    "repo/results/*/vocab/coverage.*",
    "repo/results/*/hidden_states/manifest.json",
    "repo/results/*/hidden_states/parts/*.json",
    "repo/results/*/drafter*/config.json",
    "repo/results/*/drafter*/metrics.json",
    "repo/results/*/drafter*/loss.png",
    "repo/results/*/bench/*.json",
    "repo/results/*/report/report.*",
    "repo/results/*/report/plots/*",
    "repo/results/*/benchmarks/*.tsv",
    "repo/results/*/logs/*.log",
    "repo/results/*/tau_vs_data/*",
    "repo/results/*/tau_vs_data/*/bench.json",
    "repo/results/*/tau_vs_data/*/drafter/metrics.json",
]
LOG_TAIL = 1 << 20
LIMIT = 15 << 20


def main(root: str, out: str) -> None:
    base = Path(root)
    files = sorted({p for pat in KEEP for p in base.glob(pat) if p.is_file()})
    with tarfile.open(out, "w:xz") as tar:
        for p in files:
            data = p.read_bytes()
            if p.suffix == ".log" and len(data) > LOG_TAIL:
                data = b"[... cut ...]\n" + data[-LOG_TAIL:]
            info = tarfile.TarInfo(str(p.relative_to(base)).removeprefix("repo/"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    size = Path(out).stat().st_size
    print(f"packed {len(files)} files into {out}: {size / 2**20:.1f} MiB")
    if size > LIMIT:
        sys.exit(f"{out} is over {LIMIT >> 20} MiB: it will not come back")


if __name__ == "__main__":
    main(*sys.argv[1:])
