"""What makes a stage stale: per rule, the config keys whose value changes its output
(:data:`RESULT_KEYS`, carried by its params: :func:`eagle3_pipeline.config.result_config`) and
the keys that change no rule's output (:data:`OPERATIONAL_KEYS`)."""

from __future__ import annotations

from .. import methods

# What a synth answer depends on (and, for vllm.max_model_len, which prompts are rejected).
SYNTH_ANSWER_KEYS = (
    "synth.max_tokens",
    "synth.temperature",
    "synth.top_p",
    "synth.seed",
    "synth.reasoning_parser",
    "synth.chat_template_kwargs",
    "vllm.device",
    "vllm.dtype",
    "vllm.max_model_len",
)
BENCH_VLLM_KEYS = (
    "vllm.device",
    "vllm.dtype",
    "vllm.tensor_parallel_size",
    "vllm.enforce_eager",
    "vllm.max_model_len",
)
# What a sample's hidden states depend on besides the row and the target (extraction's result
# keys without how its work is split into jobs and shards): the train job's, when it extracts
# them itself (extract.mode online or hybrid). extract.layer_ids only for a method without
# layers of its own.
ONLINE_EXTRACTION_KEYS = (
    "extract.mode",
    "extract.layer_ids",
    "extract.storage",
    "vllm.device",
    "vllm.dtype",
)
# Config keys whose value changes a rule's output, per rule. A rule's params carry exactly these
# (config.result_config), so a change of one re-runs that rule and everything downstream of it.
# A prompts_bench job gets only its own set's entry of prompts.bench.
RESULT_KEYS: dict[str, tuple[str, ...]] = {
    "target": (
        "target.source",
        "target.path",
        "target.revision",
        "target.dtype",
        "target.trust_remote_code",
        "target.chat_template",
    ),
    # A prompt is kept where it fits the context its answer leaves (target.chat.ContextLimit):
    # the training pool's answers are synth's, a benchmark set's the bench's.
    # The pool is decontaminated against the sources of prompts.bench (config.result_config
    # adds them, without what only samples a set: a new set of a source already there re-runs
    # nothing here).
    "prompts_train": (
        "prompts.seed",
        "prompts.max_chars",
        "prompts.train",
        "prompts.heldout",
        "prompts.near_duplicates",
        "prompts.decontamination_ngram",
        "vllm.max_model_len",
        "synth.max_tokens",
        "synth.chat_template_kwargs",
    ),
    # A self_written source's parts and their gather: besides these, the source's own writing
    # keys (self_written.WRITE_KEYS) and, where it writes more than one turn, synth's answer
    # keys (self_written.ANSWER_KEYS): config.result_config adds them per source.
    "prompts_write": (
        "prompts.seed",
        "synth.chat_template_kwargs",
        "synth.jobs",
        "vllm.device",
        "vllm.dtype",
        "vllm.max_model_len",
    ),
    "prompts_write_gather": (
        "prompts.seed",
        "synth.chat_template_kwargs",
        "vllm.device",
        "vllm.dtype",
        "vllm.max_model_len",
    ),
    "prompts_bench": (
        "prompts.seed",
        "prompts.max_chars",
        "prompts.bench",
        "vllm.max_model_len",
        "bench.max_tokens",
        "bench.chat_template_kwargs",
    ),
    # One job per part of the prompts (synth.jobs of them): which prompts a part answers
    # depends on the number of parts; what an answer is does not (synth.stage.JOURNAL_KEYS).
    # synth.context decides the messages sent (the prompt source's assistant turns or the
    # target's own) and how prompts fall into parts (by conversation when on_policy).
    "synth": (*SYNTH_ANSWER_KEYS, "synth.context", "synth.jobs"),
    # The merged answers and their check: the same whatever the number of parts.
    "synth_gather": (*SYNTH_ANSWER_KEYS, "synth.context"),
    "prepare": ("prepare.seq_length", "prepare.cut_loops", "prompts.seed"),
    "vocab": ("vocab.draft_vocab_size", "vocab.target_coverage"),
    "extract": (
        "extract.layer_ids",
        "extract.storage",
        "extract.samples_per_shard",
        "extract.jobs",
        "vllm.device",
        "vllm.dtype",
    ),
    "extract_gather": (),
    # One job per method, whose params carry only the keys that method reads
    # (methods.method_train_config): a key of train.<method> re-runs that method's training
    # alone.
    "train": (
        *(f"train.{k}" for k in methods.SHARED_TRAIN_KEYS),
        *(f"train.{m}" for m in methods.METHODS),
        "train.variants",
        # stored: the hidden states are an input (the manifest) and none of extraction's keys
        # is a param; online/hybrid: the train job extracts, so its params carry
        # ONLINE_EXTRACTION_KEYS (result_config)
        "extract.mode",
    ),
    # The baseline on its own (bench.pairing: separate), shared by every method.
    "bench_baseline": (
        "bench.prompt_sets",
        "bench.temperatures",
        "bench.concurrency",
        "bench.max_tokens",
        "bench.chat_template_kwargs",
        "bench.rounds",
        *BENCH_VLLM_KEYS,
    ),
    # One job per method; num_speculative_tokens is that method's list.
    "bench": (
        "bench.prompt_sets",
        "bench.num_speculative_tokens",
        "bench.temperatures",
        "bench.concurrency",
        "bench.max_tokens",
        "bench.chat_template_kwargs",
        "bench.speculative_config",
        "bench.rounds",
        "bench.pairing",
        "bench.gate",
        *BENCH_VLLM_KEYS,
    ),
    # the methods to put side by side (adding one adds its train and bench jobs)
    "report": ("run", "train.methods"),
}

# Keys that change no rule's output: they decide how a stage runs, not what it produces -
# where and how fast (concurrency, timeouts, retries, memory, server arguments and environment,
# data loader workers, logging) and the acceptance checks that fail a job (a stricter threshold
# applies from the next run that computes). Jobs read them from the config, so changing one
# re-runs nothing. A key that changes one rule's output is operational for the other rules
# (vllm.tensor_parallel_size sets the speed bench measures, and only how synth runs).
# `results_dir` is part of every output path: another value is another run, not a re-run.
OPERATIONAL_KEYS: tuple[str, ...] = (
    "results_dir",
    "vllm.startup_timeout_s",
    "vllm.shutdown_grace_s",
    "vllm.cpu_kvcache_gib",
    "vllm.gpu_memory_gib",
    "plan.allow",
    "vllm.extra_args",
    "vllm.env",
    "prompts.max_bad_fraction",
    "synth.endpoint",
    "synth.api_key_env",
    "synth.model_name",
    "synth.concurrency",
    "synth.servers_per_gpu",
    "synth.request_timeout_s",
    "synth.retries",
    "synth.server_args",
    "synth.max_failed_fraction",
    "synth.max_template_mismatch_fraction",
    "extract.concurrency",
    "extract.request_timeout_s",
    "extract.retries",
    "extract.min_next_token_agreement",
    "extract.agreement_positions_per_sample",
    "extract.verify_device",
    "extract.reference_forward",
    "extract.max_reference_rel_error",
    "extract.server_args",
    "extract.hybrid_disk_gib",
    "extract.servers",
    "extract.colocate",
    "extract.colocated_gpu_memory",
    "extract.endpoints",
    "extract.transport",
    "extract.mooncake",
    "train.num_workers",
    "train.log_freq",
    "bench.request_timeout_s",
    "bench.server_args",
)
