"""Exit non-zero unless MODEL_DIR's routed experts are W4A16 group 32 (compressed-tensors), the
format the GPU run of the miniature is meant to serve; a bf16 export would run vLLM's unquantized
MoE instead of Marlin WNA16 and measure the wrong kernel.

    python3 lab/gpu/miniature_quantized.py MODEL_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eagle3_pipeline.engine.target_class import facts


def problem(model_dir: Path) -> str | None:
    config = json.loads((model_dir / "config.json").read_text())
    # 4-bit experts as the plan sees them (the check that refuses them on a CPU without AMX)
    if not facts(config)["int4_weights"]:
        return f"{model_dir} has no 4-bit routed experts: a bf16 export, not the W4A16 miniature"
    quant = (config.get("text_config") or config).get("quantization_config") or config.get(
        "quantization_config"
    )
    weights = [g.get("weights", {}) for g in quant.get("config_groups", {}).values()]
    if quant.get("quant_method") != "compressed-tensors" or not any(
        w.get("num_bits") == 4 and w.get("group_size") == 32 for w in weights
    ):
        return f"{model_dir}: quantization_config is not compressed-tensors W4A16 group 32: {quant}"
    return None


def main(argv: list[str] | None = None) -> None:
    model_dir = (argv if argv is not None else sys.argv[1:])[0]
    found = problem(Path(model_dir))
    if found:
        sys.exit(found + " (build it with lab/gpu/pack_miniature.sh)")
    print(f"{model_dir}: routed experts W4A16 group 32 (compressed-tensors)")


if __name__ == "__main__":
    main()
