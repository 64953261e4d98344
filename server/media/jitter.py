"""Inbound audio reaches the voice loop one packet after it arrives, not four.

aiortc's receiver holds every audio frame until 4 later packets are in (``JitterBuffer(capacity=16,
prefetch=4)``): a fixed 80 ms, meant for smooth playout. Vigil analyses audio, it does not play it, so that delay
only makes the end of every user turn reach the voice loop 80 ms late. Prefetch does not decide what is lost: a
missing packet stalls the buffer the same way at any prefetch until the 16-packet capacity overflows, and a packet
that arrives out of order still waits in its slot. One packet is the least aiortc's buffer allows (a frame is
complete when the next one begins).
"""

from __future__ import annotations

import logging
from typing import Any

from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer

log = logging.getLogger(__name__)

AUDIO_PREFETCH = 1
_ATTRIBUTE = "_RTCRtpReceiver__jitter_buffer"  # aiortc 1.x keeps it private; pinned in requirements.lock


def lower_audio_latency(pc: RTCPeerConnection, track: Any) -> bool:
    """Give the receiver of the inbound audio ``track`` a one-packet jitter buffer; False (and a warning) if this
    aiortc keeps its buffer elsewhere. Call from the ``track`` event, before media flows."""
    for receiver in pc.getReceivers():
        if receiver.track is track and track.kind == "audio":
            buffer = getattr(receiver, _ATTRIBUTE, None)
            if not isinstance(buffer, JitterBuffer):
                log.warning("aiortc's receiver has no %s: inbound audio keeps aiortc's 80 ms prefetch", _ATTRIBUTE)
                return False
            setattr(receiver, _ATTRIBUTE, JitterBuffer(capacity=buffer.capacity, prefetch=AUDIO_PREFETCH))
            return True
    return False
