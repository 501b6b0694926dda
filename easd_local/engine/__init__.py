"""The decoding core: configs, the modes and the ways, the gate, the acceptance rules, the
drafters, the per-mode steps and the batched scheduler. llama.cpp itself (loading, batched
decodes, vocabularies, repacking, RPC, quantizing) is ``easd_local.llamacpp``, below it; the
core never touches ctypes."""
