"""`easd-local serve`: an OpenAI-compatible HTTP server over the decoding engine.

Layers, each in its own module: ``protocol`` (request parsing and validation, pure),
``responses`` (the OpenAI response shapes and the statistics object, pure), ``stops``
(stop strings over streamed text, pure), ``engine`` (the thread that owns the scheduler),
``metrics`` (Prometheus counters) and ``app`` (Starlette routes: the only module here that
speaks HTTP).
"""
