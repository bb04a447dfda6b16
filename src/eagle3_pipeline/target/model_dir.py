"""What a target's model directory must hold before any job loads it, checked from its files
alone (nothing is imported or loaded): a tokenizer, a chat template that is valid Jinja, and the
config.json facts the config's keys are bounded by (the vocabulary a draft vocabulary is taken
from, the positions vllm.max_model_len may use).

Each problem is a line naming the config key and the file, as the config check reports them
(:func:`eagle3_pipeline.config.checks.check_semantics`), so that a directory without a
tokenizer fails before the first job rather than with "you need sentencepiece or tiktoken"
inside one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from ..engine.target_class import tokenizer_is_remote_code

SMOLLM2_135M = {  # the packaged target's shape (SmolLM2-135M-Instruct)
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
}

# A directory holds a tokenizer transformers can load when it has one of these: a fast
# tokenizer (tokenizer.json), a BPE vocabulary (vocab.json), a WordPiece one (vocab.txt), or a
# sentencepiece or tiktoken model (*.model, *.tiktoken: Llama 2, Kimi).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt")
TOKENIZER_SUFFIXES = (".model", ".tiktoken")
# The config.json keys vLLM takes a model's context length from (the smallest it finds), and
# the RoPE scalings whose max_position_embeddings is already scaled (vllm.config.model).
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
SCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# vLLM's switch that lets max_model_len exceed the model's positions
ALLOW_LONG = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def tokenizer_problem(model_dir: Path) -> str | None:
    """Why ``model_dir`` has no tokenizer, or None."""
    files = [p.name for p in model_dir.iterdir() if p.is_file()]
    if any(n in TOKENIZER_FILES or n.endswith(TOKENIZER_SUFFIXES) for n in files):
        return None
    if tokenizer_is_remote_code(model_dir):  # its own code reads its files (a trust question)
        return None
    return (
        f"{str(model_dir)!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}, *.model, "
        "*.tiktoken): copy the model's tokenizer files into it (every server and the prompts "
        "stage load the tokenizer from there)"
    )


def own_templates(model_dir: Path) -> dict[str, str]:
    """The chat templates a model directory defines, by the file that holds them:
    chat_template.jinja, chat_template.json's ``chat_template``, tokenizer_config.json's
    ``chat_template`` (a string, or named templates). ValueError for a JSON file that cannot be
    read."""
    found: dict[str, str] = {}
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        found[str(jinja)] = jinja.read_text(encoding="utf-8", errors="replace")
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            template = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, AttributeError) as e:
            raise ValueError(f"{path} is not a JSON object ({e})") from None
        if isinstance(template, str):
            found[str(path)] = template
        elif isinstance(template, list):  # [{"name": ..., "template": ...}]
            for t in template:
                if isinstance(t, dict) and isinstance(t.get("template"), str):
                    found[f"{path} ({t.get('name')})"] = t["template"]
    return found


class _Generation(jinja2.ext.Extension):
    """The ``{% generation %}`` block transformers' templates may use (its AssistantTracker),
    parsed as its body: enough to tell whether a template is valid Jinja."""

    tags = frozenset({"generation"})

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def jinja_problem(template: str) -> str | None:
    """Where ``template`` is not valid Jinja (as transformers compiles a chat template), or
    None."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    try:
        env.parse(template)
    except jinja2.TemplateSyntaxError as e:
        return f"line {e.lineno}: {e.message}"
    return None


def template_problems(target: dict) -> list[str]:
    """The chat template every server of the target renders with: target.chat_template's file,
    else the model directory's own (a local target). Each must be valid Jinja; a local target
    without either has none to render a prompt with."""
    override = target.get("chat_template")
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            return [f"config key `target.chat_template`: file {str(path)!r} not found"]
        wrong = jinja_problem(path.read_text(encoding="utf-8", errors="replace"))
        return (
            [f"config key `target.chat_template`: {path} is not a valid Jinja template ({wrong})"]
            if wrong
            else []
        )
    if target["source"] != "local":
        return []
    model_dir = Path(target["path"]).expanduser()
    try:
        templates = own_templates(model_dir)
    except ValueError as e:
        return [f"config key `target.path`: {e}"]
    if not templates:
        return [
            f"config key `target.chat_template`: the model directory {str(model_dir)!r} has no "
            "chat template (no chat_template.jinja, none in tokenizer_config.json or "
            "chat_template.json); a server renders every prompt with one: set "
            "target.chat_template to a Jinja template file"
        ]
    return [
        f"config key `target.path`: the chat template in {where} is not valid Jinja ({wrong}); "
        "fix it, or set target.chat_template to a template file that replaces it"
        for where, text in templates.items()
        if (wrong := jinja_problem(text))
    ]


def model_dir_problems(target: dict) -> list[str]:
    """What a local target's directory lacks (its config.json is checked by the caller), and
    whether the chat template of any target is valid Jinja."""
    problems = []
    if target["source"] == "local":
        wrong = tokenizer_problem(Path(target["path"]).expanduser())
        if wrong:
            problems.append(f"config key `target.path`: {wrong}")
    return problems + template_problems(target)


def known_config(target: dict) -> tuple[dict, str] | None:
    """The target's config.json and where it was read, where that needs no download: the
    packaged model's known shape, a local directory's file (None for a hub target, or one
    that cannot be read: other checks report that)."""
    if target["source"] == "packaged":
        return SMOLLM2_135M, "the packaged SmolLM2-135M-Instruct"
    if target["source"] != "local":
        return None
    path = Path(target["path"]).expanduser() / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return (cfg, str(path)) if isinstance(cfg, dict) else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def max_positions(cfg: dict, tokenizer_config: dict | None = None) -> tuple[int, str] | None:
    """The longest context vLLM serves the model of config.json ``cfg`` with (its
    ``derived_max_model_len``: the smallest position key, or model_max_length where the config
    has one, no more than the tokenizer's model_max_length, times the RoPE scaling factor where
    the positions are not scaled already) and the keys it came from; None where no key says."""
    text = cfg.get("text_config") or cfg
    found = [(n, key) for key in POSITION_KEYS if (n := _number(text.get(key))) is not None]
    if (own := _number(text.get("model_max_length"))) is not None:
        found = [(own, "model_max_length")]
    if not found:
        return None
    n, key = min(found)
    tokenizer_max = _number((tokenizer_config or {}).get("model_max_length"))
    if tokenizer_max is not None and tokenizer_max < n:
        n, key = tokenizer_max, "model_max_length of tokenizer_config.json"
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    if isinstance(rope, dict) and "gemma3" not in str(text.get("model_type")):
        kind = rope.get("rope_type") or rope.get("type")
        factor = _number(rope.get("factor"))
        if kind not in SCALED_ROPE and factor:
            n, key = n * factor, f"{key} x rope_scaling.factor {rope['factor']}"
    return int(n), key


def _tokenizer_config(target: dict) -> dict | None:
    if target["source"] != "local":
        return None
    try:
        path = Path(target["path"]).expanduser() / "tokenizer_config.json"
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def shape_problems(cfg: dict, target: dict) -> list[str]:
    """vocab.draft_vocab_size within the target's vocabulary, vllm.max_model_len within its
    positions (unless vllm.env sets VLLM_ALLOW_LONG_MAX_MODEL_LEN, as vLLM allows), from the
    target's config.json where it is at hand (:func:`known_config`)."""
    known = known_config(target)
    if known is None:
        return []
    raw, where = known
    text = raw.get("text_config") or raw
    problems = []
    k, vocab = cfg["vocab"]["draft_vocab_size"], _number(text.get("vocab_size"))
    if isinstance(k, int) and vocab is not None and k > vocab:
        problems.append(
            f"config key `vocab.draft_vocab_size`: {k} is more than the target's vocabulary "
            f"({int(vocab)} tokens, vocab_size in {where}); the draft vocabulary is a subset "
            f"of it: set at most {int(vocab)}, or auto"
        )
    positions = max_positions(raw, _tokenizer_config(target))
    length = cfg["vllm"]["max_model_len"]
    if positions and length > positions[0] and not cfg["vllm"]["env"].get(ALLOW_LONG):
        problems.append(
            f"config key `vllm.max_model_len`: {length} is more than the target's "
            f"{positions[0]} positions ({positions[1]} in {where}): vLLM refuses to start "
            f"such a server. Set at most {positions[0]} (and prepare.seq_length with it), or "
            f"set vllm.env: {{{ALLOW_LONG}: '1'}} if the model is known to work longer"
        )
    return problems
