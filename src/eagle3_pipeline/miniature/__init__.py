"""A miniature Kimi-K2.5, built from packaged data alone, small enough for CI (docs/miniature.md).

tokenizer   Kimi's vocabulary layout (163,840 ids, its special tokens at their ids) as a
            byte-level BPE trained on the packaged ShareGPT; the chat template
config      the kimi_k25 wrapper around a DeepSeek-V3 text model, at CI size
teacher     the committed teacher corpus (SmolLM2-135M's answers) and its thinking turns
distill     training with a compact vocabulary and a sink row
checkpoint  tensors under Kimi-K2.5's checkpoint names
quantize    routed experts to compressed-tensors W4A16 (pack-quantized, group 32)
stats       how varied and well-formed the model's answers are
build       build(): all of it, once per fingerprint
"""
