"""The reference engine runs on numpy: every engine container of the e2e world is a fresh
``python -m kvgate_engine.reference`` process, and importing torch cost ~3 CPU-seconds each."""

from __future__ import annotations

import subprocess
import sys

IMPORT_EVERY_MODULE = """
import pkgutil, sys
import kvgate_engine.reference as package
for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if module.name != "kvgate_engine.reference.__main__":  # __main__ would run an engine
        __import__(module.name)
loaded = sorted(n for n in sys.modules if n.startswith("kvgate_engine.reference."))
print(len(loaded), "modules")
assert "kvgate_engine.reference.engine" in loaded and "kvgate_engine.reference.main" in loaded
torch = sorted(n for n in sys.modules if n == "torch" or n.startswith("torch."))
assert not torch, f"the reference engine imported {torch[:5]}"
"""


def test_the_reference_engine_package_never_imports_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_MODULE], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "modules" in result.stdout
