"""Inbound media reaches the pipeline as soon as it is complete: one audio packet after it arrives (not four), and
no backlog left standing in the jitter buffer after a burst.

aiortc's receiver holds every audio frame until 4 later packets are in (``JitterBuffer(capacity=16,
prefetch=4)``): a fixed 80 ms, meant for smooth playout. Vigil analyses audio, it does not play it, so that delay
only makes the end of every user turn reach the voice loop 80 ms late. Prefetch does not decide what is lost: a
missing packet stalls the buffer the same way at any prefetch until the 16-packet capacity overflows, and a packet
that arrives out of order still waits in its slot. One packet is the least aiortc's buffer allows (a frame is
complete when the next one begins).

aiortc's buffer also hands out at most one frame per packet that arrives. Whatever piled up
behind a gap (a packet lost, or late: a data-channel flood filled the socket, a stalled sender caught up) then
stays: audio is one packet a frame, so the pile never shrinks, up to the buffer's 16 packets (~0.3 s), and video
frames of one packet each stay up to 512 packets (17 s at 30 fps). The media is complete and in order but runs that
much behind its own timestamps for the rest of the session, and ``vigil_media_delay_seconds`` (load admission)
never comes back down. ``release_backlog`` passes every complete frame on to the decoder at once.
"""

from __future__ import annotations

import logging
import queue
from typing import Any

from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer, JitterFrame

log = logging.getLogger(__name__)

AUDIO_PREFETCH = 1
# aiortc 1.x keeps these private; pinned in requirements.lock (tests/integration/test_webrtc_session.py checks them)
_BUFFER = "_RTCRtpReceiver__jitter_buffer"
_DECODER_QUEUE = "_RTCRtpReceiver__decoder_queue"
_TIMESTAMPS = "_RTCRtpReceiver__timestamp_mapper"


class DrainingJitterBuffer(JitterBuffer):
    """aiortc's jitter buffer, which can also give out the further frames that are already complete."""

    def ready(self) -> JitterFrame | None:
        """The next complete frame (past the prefetch), or None."""
        return self._remove_frame(0)  # aiortc's lookup starts at the buffer's origin; the argument is unused


class DrainingDecoderQueue(queue.Queue):  # type: ignore[type-arg]
    """The receiver's queue to its decoder thread: when the receiver passes on a frame, every further complete
    frame in the jitter buffer follows it (the same codec; timestamps mapped as the receiver maps them)."""

    def __init__(self, buffer: DrainingJitterBuffer, timestamps: Any) -> None:
        super().__init__()
        self.buffer, self.timestamps = buffer, timestamps
        self.released = 0  # frames passed on beyond aiortc's one per packet

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        if item is None:  # the receiver stopping its decoder
            return
        codec = item[0]
        while (frame := self.buffer.ready()) is not None:
            frame.timestamp = self.timestamps.map(frame.timestamp)
            self.released += 1
            super().put((codec, frame), block, timeout)


def release_backlog(pc: RTCPeerConnection, track: Any) -> bool:
    """Give the receiver of the inbound ``track`` a jitter buffer that leaves no backlog behind a gap (audio: one
    packet of prefetch); False (and a warning) if this aiortc keeps its receiver's parts elsewhere. Call from the
    ``track`` event, before media flows (the receiver starts its decoder thread on its queue later)."""
    for receiver in pc.getReceivers():
        if receiver.track is not track:
            continue
        buffer = getattr(receiver, _BUFFER, None)
        decoder_queue = getattr(receiver, _DECODER_QUEUE, None)
        timestamps = getattr(receiver, _TIMESTAMPS, None)
        if not isinstance(buffer, JitterBuffer) or not isinstance(decoder_queue, queue.Queue) or timestamps is None:
            log.warning("aiortc's receiver has no %s, %s or %s: inbound %s keeps aiortc's jitter buffer",
                        _BUFFER, _DECODER_QUEUE, _TIMESTAMPS, track.kind)
            return False
        prefetch = AUDIO_PREFETCH if track.kind == "audio" else buffer._prefetch
        draining = DrainingJitterBuffer(capacity=buffer.capacity, prefetch=prefetch, is_video=buffer._is_video)
        setattr(receiver, _BUFFER, draining)
        setattr(receiver, _DECODER_QUEUE, DrainingDecoderQueue(draining, timestamps))
        return True
    return False
