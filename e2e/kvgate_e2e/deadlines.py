"""Deadlines several e2e files share: how long a wait may take before the test gives up.

A deadline is not a bound the test asserts: only a step that never happens reaches one, so each is
many times what the step takes in ``make test`` (the run prints what it measured) and holds on a
machine at half speed (``make test-loaded``). Each names what it bounds and why that number
(docs/testing.md, "bounds"); a wait particular to one file keeps its own named constant there, and
a bound a test asserts is derived from what the run measured, never taken from here.
"""

from __future__ import annotations

# ------------------------------------------------------------------------- kvgate's steps
# The first revision (router and engines) from apply to Ready, or a revision refused once its
# engines started and reported (refused pool, failed verification): each reference engine loads in
# ENGINE_LOAD_SECONDS (4 s), then verification and the router: seconds to tens of seconds in
# make test; generous so a machine at half speed, with a busy scheduler, passes.
REVISION_DEADLINE = 300
# A revision's engines started (the 4 s load) and judged, verified or gated False (KvPoolTooSmall),
# with no router needed: a revision's start without its routing.
ENGINE_VERDICT_DEADLINE = 180
# An engine restarted: its container killed and started again (the 4 s load), its verdict, the
# pod's Ready; seconds in make test.
RESTART_DEADLINE = 120
# One reference engine pod (not a revision: a tenant's pod, a replacement, one role) scheduled,
# started (the 4 s load) and Ready.
ENGINE_POD_DEADLINE = 120
# What the operator's first passes of a newly applied ModelDeployment write before any engine
# starts (a Degraded condition: Conflict, LeaderWorkerSetUnavailable; the router's Deployment
# and RBAC): as long as a start, since the shared world's operator may be busy with other files'
# ModelDeployments.
FIRST_PASS_DEADLINE = 120
# A role's count changed (kubectl scale, a patch of a RoleScale): one more engine scheduled,
# started (the 4 s load), verified and counted, or one drained and gone.
ROLE_SCALE_DEADLINE = 180
# Engine pods gone: a deleted pod or a revision scaled to 0 (its grace period, the kubelet's kill,
# the deletion finishing).
POD_GONE_DEADLINE = 120
# A revision's routers scaled to 0 and their pods gone (smg drains up to 5 s on SIGTERM).
ROUTERS_GONE_DEADLINE = 90
# A routing step: smg discovering or dropping an engine (1 s health checks), an EndpointSlice or
# a Service following a pod's readiness, a known answer, a few requests; seconds in make test.
STEP_DEADLINE = 60
# The first known answer through the Service once the revision is Ready (the EndpointSlice, smg
# discovering both engines), or the first after the router's outage: above STEP_DEADLINE as it
# follows a whole start.
ANSWER_DEADLINE = 90
# The first answer through smg from a pair of real CPU SGLang engines (test_scenario_real_*):
# smg reports healthy before it has discovered them, and a CPU prefill takes seconds.
REAL_ANSWER_DEADLINE = 120
# A request through a router that just turned Ready, retried while the Service's path resets the
# first connections (seen in a fresh-clone run with both workers already in the router).
RESET_RETRY_DEADLINE = 30
# A condition, an Event or a status field for a verdict or a change already made (a gate patched,
# a pod deleted): one controller pass and an API write; under a second in make test.
EVENT_DEADLINE = 30
# What one or a few reconcile passes write (a lost object recreated, a rollout's status, a new
# revision's Deployments): a pass runs on every watch event and at each re-verification
# (KVGATE_REVERIFY_SECONDS, 2 s in the e2e world); seconds in make test.
PASS_DEADLINE = 60
# Namespaces deleted by a test gone: the namespace controller starts 5 s after the request, then
# the kubelet stops each pod (its grace period) and the pods' deletion finishes.
NAMESPACES_GONE_DEADLINE = 120

# The operator's router audit finding a worker someone added to smg (not a verified engine pod of
# the revision) and removing it at a later pass; the run prints the time it took.
ROUTER_AUDIT_DEADLINE = 60
# The controller manager's ServiceAccount controller creating a new namespace's default account.
SERVICE_ACCOUNT_DEADLINE = 60
# The quota controller's first count of a namespace's usage (the quota admission admits nothing
# before it): its resync of a new ResourceQuota.
QUOTA_DEADLINE = 60
# A request admitted once a test lifted an admission policy's binding (attack_helpers.
# policy_lifted): the API server drops the binding from its policy cache on the watch event.
POLICY_LIFT_DEADLINE = 30

# ------------------------------------------------------------------ single HTTP requests
# One small GET of a local server (an engine's /server_info, smg's /workers, /v1/models): it
# answers in milliseconds; the timeout only ends a hung connection.
HTTP_GET_TIMEOUT = 5
# One request to smg's worker API (/workers): it answers or refuses (401) at once.
ROUTER_API_TIMEOUT = 10
# One GET of an engine's /server_info where its numbers are read (a real SGLang's too): at once.
SERVER_INFO_TIMEOUT = 10
# One GET of a /metrics page (the operator's, an engine's): it answers at once; ends a hung one.
METRICS_TIMEOUT = 10
# One short generation (a few tokens) through smg or an engine: the reference engine answers in
# well under a second; the timeout only ends a request that hangs (a lost worker, a stuck leg).
GENERATE_TIMEOUT = 60

# ------------------------------------------------------------------------------ local commands
# A build script asked only where its artifact is (--print-path, --print-dir): it builds nothing.
BUILD_QUERY_TIMEOUT = 60
