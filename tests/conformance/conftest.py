def pytest_configure(config):  # type: ignore[no-untyped-def]
    config.addinivalue_line(
        "markers",
        "conformance: parses kvgate's engine argv with real SGLang releases (installs them once "
        "under ${KVGATE_CACHE:-~/.cache/kvgate}/conformance; needs PyPI and torch in the venv)",
    )
