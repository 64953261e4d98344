"""Cluster mode: many Vigil nodes as one through Redis (membership, source placement, leases, drain) and its
/api/cluster routes."""
