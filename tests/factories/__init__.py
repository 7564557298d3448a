"""Shared builders of test inputs and stand-in peers; tests/conftest.py puts tests/ on the path.

- model_deployments: ModelDeployment documents and models (NOW, MD_UID, md_doc, make_md)
- model_configs: the published Hugging Face config.json files in tests/fixtures/model_configs/
- kmock_world: the kmock API emulator's resources, the objects kvgate reads there and its requests
- fake_engine: a tiny SGLang-shaped engine on 127.0.0.1
- local_http: any aiohttp app served on 127.0.0.1
- golden: the operator's golden files (tests/golden/operator/)
- release_answers: what an SGLang release's own parser answers, asked in a subprocess, cached
  on disk (the conformance tier)
"""
