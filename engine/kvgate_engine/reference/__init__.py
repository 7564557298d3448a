"""kvgate's CPU reference engine: a small numpy engine that speaks SGLang.

Run it with ``python -m kvgate_engine.reference <sglang.launch_server flags>``. It sizes a paged
KV pool from a model's config.json and a simulated GPU (``KVGATE_GPU_MEMORY_GIB``) with kvgate's
estimator, serves SGLang's HTTP endpoints with SGLang's JSON keys, hands KV from a prefill to a
decode process over TCP, and can reproduce the pre-0.5.21 incident (``KVGATE_EMULATE_INCIDENT=1``
or ``KVGATE_ENGINE_VERSION`` < 0.5.21) in which stale KV pages leaked across requests.

It runs on numpy alone and never imports torch (tests/reference/test_no_torch.py): every engine
container of the e2e world is a fresh process, and importing torch cost ~3 CPU-seconds each.
"""
