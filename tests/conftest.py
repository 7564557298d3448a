"""The unit tests' root. Its presence puts tests/ on sys.path, so every test imports the shared
builders as ``factories`` (tests/factories/); shared fixtures live in the conftest.py of the
folder whose tests use them, or, used by tests of several folders, in a ``factories`` module
loaded here as a plugin (the kmock Runtime: factories.kmock_runtime; the live webhook:
factories.admission_reviews)."""

pytest_plugins = ("factories.admission_reviews", "factories.kmock_runtime")
