"""Empirical privacy audits: statistics of scores, not accounting (numpy/scipy only, no torch, no I/O).

Training produces the scores (e.g. per-example losses of members and non-members); the modules here
turn them into statements with their confidence. `membership` is the loss-threshold membership-
inference audit; `dpw audit` (engine.audit_run) feeds it a stored run's model and data split.
`canaries` turns guesses about randomly included canaries into an epsilon lower bound (one run); the
canaries ride along in the real training (engine.dpsgd.canaries builds and scores them).
"""

from engine.audit.canaries import CanaryAudit, CanaryGuesses, canary_audit, canary_guesses, epsilon_lower_bound
from engine.audit.membership import MembershipAudit, TheoryCheck, membership_audit

__all__ = ["CanaryAudit", "CanaryGuesses", "MembershipAudit", "TheoryCheck", "canary_audit", "canary_guesses",
           "epsilon_lower_bound", "membership_audit"]
