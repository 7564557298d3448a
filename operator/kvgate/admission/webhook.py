"""The validating webhook for ModelDeployments: a thin kopf handler over the pure checks.

Registration is importing this module (kopf's decorator adds the handler to its default
registry) and calling `kvgate.admission.server.configure_webhook_server` at operator start-up.
The handler id is pinned: the ValidatingWebhookConfiguration's path is `/validate-modeldeployment`.

The cluster's policy (the engine version floor from the chart) reaches the handler through kopf's
memo: the operator passes `kopf.Memo({POLICY_MEMO_KEY: ClusterPolicy(...)})` to `kopf.operator`;
without one, no cluster floor applies (each spec's own floor still does).
"""

from __future__ import annotations

from typing import Any

import kopf

from kvgate.admission.checks import check_document, check_update
from kvgate.admission.policy import POLICY_MEMO_KEY, ClusterPolicy
from kvgate.api import GROUP, PLURAL, VERSION

HANDLER_ID = "validate-modeldeployment"
WEBHOOK_PATH = f"/{HANDLER_ID}"
# 422 Unprocessable Entity, like the API server's own schema failures ("... is invalid").
DENIAL_CODE = 422


def _policy(memo: object) -> ClusterPolicy:
    policy = memo.get(POLICY_MEMO_KEY) if isinstance(memo, dict) else None
    return policy if isinstance(policy, ClusterPolicy) else ClusterPolicy()


@kopf.on.validate(GROUP, VERSION, PLURAL, id=HANDLER_ID, operations=["CREATE", "UPDATE"])
async def validate_modeldeployment(
    body: kopf.Body,
    warnings: list[str],
    old: kopf.Body | None = None,
    operation: str | None = None,
    memo: object = None,
    **_: Any,
) -> None:
    """Deny an unsafe ModelDeployment with every problem; pass the warnings on."""
    policy = _policy(memo)
    # Plain dicts: kopf's Body is a read-only view, slower to walk on every request.
    document = dict(body)
    if operation == "UPDATE":
        result = check_update(document, dict(old) if old is not None else None, policy)
    else:
        result = check_document(document, policy)
    warnings.extend(str(warning) for warning in result.warnings)
    if not result.allowed:
        # kopf logs the denial itself ("... failed permanently: <message>").
        raise kopf.AdmissionError(result.message, code=DENIAL_CODE)
