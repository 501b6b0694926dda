"""The engine: llama.cpp (the runtime layer: runtime, vocab, llama_log and devices, the only
modules that touch ctypes) and the maths of decoding: configs, modes, the gate, acceptance rules,
the per-mode steps and the batched scheduler."""
