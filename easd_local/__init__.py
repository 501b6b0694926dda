"""easd-local: Entropy-Aware Speculative Decoding on local GGUF pairs through llama.cpp."""

__version__ = "0.1.0"
