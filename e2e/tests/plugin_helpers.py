"""The kubectl plugin (``kubectl kvgate ...``) as a user's shell runs it: the installed
``kubectl-kvgate`` script found on PATH by the world's own kubectl, inside the cluster's network
namespace, with a kubeconfig in ``KUBECONFIG`` (the admin's, or a tenant's own token)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvgate_e2e.world import World

BIN = Path(sys.executable).parent
PLUGIN = "kubectl-kvgate"
# One kubectl kvgate command (history, explain, rollback): a few API reads and writes.
PLUGIN_TIMEOUT = 60


def plugin_directory(scratch: Path) -> Path:
    """The directory that holds ``kubectl-kvgate``: the venv's, once ``pip install`` of the
    repository made it (``make`` reinstalls when pyproject.toml changes); else a script in
    ``scratch`` that is exactly what pip writes for the entry point."""
    if (BIN / PLUGIN).is_file():
        return BIN
    script = scratch / PLUGIN
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom kvgate.cmd.cli import kubectl_plugin\n"
        "sys.exit(kubectl_plugin())\n"
    )
    script.chmod(0o755)
    print(f"NOTE {PLUGIN} is not installed in {BIN}: using {script} (reinstall the venv)")
    return scratch


def kubectl_kvgate(
    world: World, plugin_dir: Path, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``kubectl kvgate ARGS`` inside the cluster's network namespace, as the admin (or as
    whoever ``kubeconfig`` names): kubectl finds the plugin on PATH and passes KUBECONFIG on
    (flags must follow the plugin's name)."""
    env = {"PATH": f"{plugin_dir}:{os.environ.get('PATH', '')}"}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    argv = [str(world.cluster.binaries.k8s), "kubectl", "kvgate", *args]
    done = world.cluster.run_in_netns(argv, env=env, check=False, timeout=PLUGIN_TIMEOUT)
    print(
        f"$ kubectl kvgate {' '.join(args)}  (exit {done.returncode})\n{done.stdout}{done.stderr}"
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def service_account_kubeconfig(
    world: World, namespace: str, service_account: str, path: Path
) -> Path:
    """A kubeconfig at ``path`` that authenticates as ``namespace``/``service_account`` with a
    token the API server issued for it (``kubectl create token``), against the world's API
    server: what a team member's kubeconfig is, with no admin credential in it."""
    token = world.kubectl(
        "create", "token", service_account, f"--namespace={namespace}", "--duration=1h"
    ).stdout.strip()
    admin = json.loads(world.cluster.kubeconfig.read_text())
    cluster = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [
            {
                "name": service_account,
                "context": {
                    "cluster": cluster["name"],
                    "user": service_account,
                    "namespace": namespace,
                },
            }
        ],
        "current-context": service_account,
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
    return path
