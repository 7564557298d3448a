"""Verification decisions (pure): the readiness gate, identity, gateway, canary and audits."""
