"""A query maintained by operators that compose: each node of its plan has its delta rule
(:mod:`.base` says what every rule computes, :mod:`.plan` which node gets which), and a step's
change is the top operator's change (:mod:`.steps`)."""

from mvsink.desired.operators.base import Operator
from mvsink.desired.operators.plan import NotMaintained, operators
from mvsink.desired.operators.steps import time_changes

__all__ = ["NotMaintained", "Operator", "operators", "time_changes"]
