"""``cluster``: several Vigil nodes coordinated through Redis (server-side sources placed, leased, taken over)."""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator

from server.config.base import Section


class ClusterSettings(Section):
    redis_url: SecretStr | None = Field(
        None, description="e.g. redis://redis:6379/0 (may hold a password). Set: this node joins the cluster that "
        "uses this Redis; unset: a standalone node."
    )
    node_id: str | None = Field(None, max_length=200, description="This node's name in the cluster; None: "
                                "'<hostname>:<port>'. Must be unique among the nodes.")
    advertise_url: str | None = Field(None, description="The base URL other nodes and clients reach this node at "
                                      "(shown in listings); None: http://<host or hostname>:<port>.")
    key_prefix: str = Field("vigil:cluster:", min_length=1, description="Prefix of the cluster's Redis keys.")
    heartbeat_s: float = Field(1.0, gt=0, description="Period of the heartbeat, lease renewal and placement pass.")
    lease_s: float = Field(5.0, gt=0, description="A source's lease: a node that stops renewing it (dead, cut "
                           "off) loses the source to another node after this long.")
    node_ttl_s: float = Field(5.0, gt=0, description="A node not heard from for this long is dead.")
    redis_timeout_s: float = Field(1.0, gt=0, description="Deadline of each Redis call (connect and reply).")
    drain_timeout_s: float = Field(30.0, gt=0, description="Longest wait, on drain or SIGTERM, for other "
                                   "nodes to take this node's sources over.")

    @model_validator(mode="after")
    def _lease_outlives_heartbeats(self) -> ClusterSettings:
        if self.lease_s < 2 * self.heartbeat_s or self.node_ttl_s < 2 * self.heartbeat_s:
            raise ValueError("lease_s and node_ttl_s must be at least twice heartbeat_s (a renewal may be late)")
        return self
