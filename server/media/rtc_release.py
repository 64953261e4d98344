"""Free a closed aiortc peer connection at once, without waiting for a full garbage collection.

aiortc's objects refer to each other in cycles (the transports' event listeners are the connection's bound
methods, the DTLS transport's RTP router holds the receivers and senders that hold it, aioice's candidate pairs
hold the STUN protocols that hold the connection, ...). ``pc.close()`` stops everything but leaves those cycles, so
a closed session's peer connection, its receivers, jitter buffers, SRTP sessions and rate counters (~1,000
``RateBucket`` each) lived on until Python's *full* collection, which a server with large models loaded runs
rarely: RSS grew with every session. This is the one place that knows aiortc's internals (1.16, pinned in
requirements.lock); ``tests/integration/test_session_release.py`` fails if an upgrade brings a cycle back.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from aiortc import RTCPeerConnection

log = logging.getLogger(__name__)


def _private(obj: Any, owner: str, name: str) -> Any:
    return getattr(obj, f"_{owner}__{name}", None)


def _forget_listeners(*emitters: Any) -> None:
    for emitter in emitters:
        if emitter is not None and hasattr(emitter, "remove_all_listeners"):
            emitter.remove_all_listeners()


def release_peer_connection(pc: RTCPeerConnection) -> None:
    """Break the reference cycles of a peer connection that ``close()`` has ended. Never raises: anything this
    aiortc lacks is skipped (the garbage collector still frees it, later)."""
    try:
        _release(pc)
    except Exception:  # an aiortc whose internals moved: the collector frees it, later
        log.warning("could not release a closed peer connection's cycles", exc_info=True)


def _release(pc: RTCPeerConnection) -> None:
    pc.remove_all_listeners()
    sctp = _private(pc, "RTCPeerConnection", "sctp")
    dtls_transports = set(_private(pc, "RTCPeerConnection", "dtlsTransports") or ())
    ice_transports = set(_private(pc, "RTCPeerConnection", "iceTransports") or ())
    for transceiver in pc.getTransceivers():
        for end in (transceiver.receiver, transceiver.sender):
            _forget_listeners(end, getattr(end, "track", None))
            dtls_transports.add(end.transport)
    if sctp is not None:
        channels = _private(sctp, "RTCSctpTransport", "data_channels") or getattr(sctp, "_data_channels", {})
        _forget_listeners(sctp, *channels.values())
        with contextlib.suppress(AttributeError):
            channels.clear()
        dtls_transports.add(sctp.transport)
    for dtls in dtls_transports:
        if dtls is None:
            continue
        _forget_listeners(dtls)
        ice_transports.add(dtls.transport)
        router = getattr(dtls, "_rtp_router", None)
        if router is not None:
            router.receivers.clear()
            router.senders.clear()
            router.ssrc_table.clear()
            router.mid_table.clear()
            router.payload_type_table.clear()
        dtls._data_receiver = None
    for ice in ice_transports:
        if ice is None:
            continue
        gatherer = ice.iceGatherer
        _forget_listeners(ice, gatherer)
        connection = getattr(ice, "_connection", None)
        if connection is not None:
            connection._check_list.clear()
            connection._early_checks.clear()
