"""llama.cpp's plumbing: loading models (runtime, vocabularies, chat templates), GGUF files,
the CPU and devices, weight repacking, RPC and quantizing. Nothing here decodes with a rule:
that is the core in ``easd_local.engine``; nothing above this package touches ctypes."""
