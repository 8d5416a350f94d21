"""Empirical privacy audits: statistics of scores, not accounting (numpy/scipy only, no torch, no I/O).

Training produces the scores (e.g. per-example losses of members and non-members); the modules here
turn them into statements with their confidence. `membership` is the loss-threshold membership-
inference audit; `dpw audit` (engine.audit_run) feeds it a stored run's model and data split.
"""

from engine.audit.membership import MembershipAudit, TheoryCheck, membership_audit

__all__ = ["MembershipAudit", "TheoryCheck", "membership_audit"]
