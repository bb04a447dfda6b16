"""The target's hidden states, from capture to training:

- :mod:`.layers`: which target layers are captured (the aux layer ids and the final layer);
- :mod:`.connector`: the vLLM KV connector that writes them out of the engine;
- :mod:`.shards`: their on-disk layout (written by extract, read by train);
- :mod:`.disk`: what they fill on the disk;
- :mod:`.checks`: the checks that catch silently wrong states at any model size;
- :mod:`.dataset`: how speculators' trainer reads them.
"""
