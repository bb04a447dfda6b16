"""The miniature's tokenizer: Kimi's vocabulary layout as a plain ``tokenizers`` BPE.

Kimi-K2/K2.5 ship a tiktoken BPE (``tiktoken.model``) behind remote code
(``tokenization_kimi.py``): 163,584 regular tokens (ids 0..163583), then 256 special and
reserved ids (163584..163839), 163,840 in all. That file cannot be downloaded here, so the
miniature trains a byte-level BPE of exactly 163,584 tokens with the same pre-tokenizer regex
(Kimi's ``pat_str``: Han runs, cased words with contractions, 1-3 digit groups, punctuation,
newlines, spaces) on the packaged ShareGPT text, and puts Kimi's special tokens at Kimi's ids:
the same ids the model's config (bos/eos/pad, media placeholder) and vLLM's Kimi code refer to.
The merges, and so the regular ids, differ from the real ones (docs/miniature.md).

Where the ids come from (none of it copied code): Kimi-K2.5's config.json (bos 163584, eos
163585, pad 163839, media placeholder 163605); Kimi's ``tokenization_kimi.py`` (256 reserved
ids after the regular ones, unnamed ones called ``<|reserved_token_{id}|>``); and the special
token table that public Kimi tokenizer re-implementations and converters agree on (the table
below, <think>/</think> included).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

NUM_REGULAR = 163_584
NUM_RESERVED = 256
VOCAB_SIZE = NUM_REGULAR + NUM_RESERVED  # 163,840

# Kimi-K2 / K2.5 special tokens at their ids; every other id in 163584..163839 is
# <|reserved_token_{id}|>, as tokenization_kimi.py names them.
SPECIAL_TOKENS: dict[int, str] = {
    163584: "[BOS]",
    163585: "[EOS]",
    163586: "<|im_end|>",
    163587: "<|im_user|>",
    163588: "<|im_assistant|>",
    163590: "<|start_header_id|>",
    163591: "<|end_header_id|>",
    163593: "[EOT]",
    163594: "<|im_system|>",
    163595: "<|tool_calls_section_begin|>",
    163596: "<|tool_calls_section_end|>",
    163597: "<|tool_call_begin|>",
    163598: "<|tool_call_argument_begin|>",
    163599: "<|tool_call_end|>",
    163601: "<|im_middle|>",
    163602: "<|media_begin|>",
    163603: "<|media_content|>",
    163604: "<|media_end|>",
    163605: "<|media_pad|>",
    163606: "<think>",
    163607: "</think>",
    163838: "[UNK]",
    163839: "[PAD]",
}
TOKEN_IDS = {name: i for i, name in SPECIAL_TOKENS.items()}
BOS, EOS, IM_END, PAD = "[BOS]", "[EOS]", "<|im_end|>", "[PAD]"

# Kimi's tokenization_kimi.py pre-tokenizer (tiktoken ``pat_str``), alternative by alternative.
KIMI_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
        r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
        r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# ShareGPT text the BPE is trained on: the first records of the packaged file, every turn,
# until this many characters. 40 M characters reach all 163,584 merges (10 M reach ~77 K: the
# trainer stops when every word is one token) in ~35 s on 2 cores.
TRAIN_CHARS = 40_000_000

CHAT_TEMPLATE = Path(__file__).parent / "chat_template.jinja"


def special_token_names() -> list[str]:
    """The 256 names of ids 163584..163839, in id order."""
    return [
        SPECIAL_TOKENS.get(i, f"<|reserved_token_{i}|>") for i in range(NUM_REGULAR, VOCAB_SIZE)
    ]


def sharegpt_text(records: Iterable, max_chars: int = TRAIN_CHARS) -> Iterator[str]:
    """Every turn's text of ShareGPT records, in file order, until ``max_chars``."""
    total = 0
    for rec in records:
        if not isinstance(rec, dict):
            continue
        for turn in rec.get("conversations") or []:
            text = turn.get("value") if isinstance(turn, dict) else None
            if isinstance(text, str) and text:
                yield text
                total += len(text)
        if total >= max_chars:
            return


def train(texts: Iterable[str]):
    """A byte-level BPE with Kimi's pre-tokenizer, exactly 163,584 regular tokens, and Kimi's
    special tokens at ids 163584..163839 (a ``tokenizers.Tokenizer``). The trainer is
    deterministic for the same text and ``tokenizers`` version."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(KIMI_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=NUM_REGULAR,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != NUM_REGULAR:
        raise RuntimeError(
            f"the BPE trainer stopped at {tok.get_vocab_size()} tokens, not {NUM_REGULAR}: "
            "give it more text"
        )
    tok.add_special_tokens([AddedToken(name, special=True) for name in special_token_names()])
    for i, name in SPECIAL_TOKENS.items():
        if tok.token_to_id(name) != i:
            raise AssertionError(f"{name} got id {tok.token_to_id(name)}, not {i}")
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise AssertionError(f"vocabulary of {tok.get_vocab_size()}, not {VOCAB_SIZE}")
    return tok


def save(tok, out_dir: Path, model_max_length: int = 262144) -> None:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja in ``out_dir``: loadable
    by ``AutoTokenizer`` (and vLLM) without remote code."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    named = [SPECIAL_TOKENS[i] for i in sorted(SPECIAL_TOKENS)]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": "[UNK]",
        "pad_token": PAD,
        "additional_special_tokens": [t for t in named if t not in (BOS, EOS, "[UNK]", PAD)],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE.read_text())
