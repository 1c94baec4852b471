"""The fleet: every edge node applies the same weights, decided by one elected leader from
every node's reports, through etcd (node.fleet).

snapshot.py is pure (the report and snapshot formats, the leader's computation, the decision
to apply, the status table) and unit-tested without root or etcd, and so is operator.py (the
fleet-wide drains and overrides the leader folds into snapshots); member.py is the etcd side
(lease, election, reports, the snapshot watch) that edged runs as one task.
"""
