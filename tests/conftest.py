"""The unit tests' root. Its presence puts tests/ on sys.path, so every test imports the shared
builders as ``factories`` (tests/factories/); shared fixtures live in the conftest.py of the
folder whose tests use them (the kmock Runtime in tests/operator/conftest.py)."""
