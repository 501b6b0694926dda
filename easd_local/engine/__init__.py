"""The engine: llama.cpp (runtime, the only module that touches ctypes) and the maths of
decoding: configs, modes, acceptance rules, steppers and the batched scheduler."""
