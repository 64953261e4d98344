"""The inbound jitter buffer leaves no backlog behind a gap: aiortc's hands out one frame per
packet that arrives, so frames piled up behind a late packet stayed for good; ``ready`` gives out the rest."""

from __future__ import annotations

from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from server.media.jitter import AUDIO_PREFETCH, DrainingJitterBuffer


def _packet(sequence: int) -> RtpPacket:
    packet = RtpPacket(payload_type=111, sequence_number=sequence, timestamp=960 * sequence)
    packet._data = bytes([sequence])  # what the receiver's depayloader sets
    return packet


def _after_a_late_packet(buffer: JitterBuffer) -> list[int]:
    """Audio frames 0..9 of one packet each, packet 1 arriving after 2..9: the frames each add() gives out."""
    out = []
    for sequence in (0, 2, 3, 4, 5, 6, 7, 8, 9, 1, 10, 11, 12):
        _, frame = buffer.add(_packet(sequence))
        if frame is not None:
            out.append(frame.data[0])
    return out


def test_aiortc_alone_keeps_the_backlog_behind_a_late_packet():
    # One frame per packet: after the gap closes, 8 complete frames stay behind, ~160 ms, for good.
    assert _after_a_late_packet(JitterBuffer(capacity=16, prefetch=AUDIO_PREFETCH)) == [0, 1, 2, 3]


def test_ready_gives_out_every_complete_frame_in_order():
    buffer = DrainingJitterBuffer(capacity=16, prefetch=AUDIO_PREFETCH)
    out = []
    for sequence in (0, 2, 3, 4, 5, 6, 7, 8, 9, 1, 10):
        _, frame = buffer.add(_packet(sequence))
        while frame is not None:
            out.append(frame.data[0])
            frame = buffer.ready()
    assert out == list(range(10))  # frame 10 waits for the next one to begin (one packet of prefetch)
    assert buffer.ready() is None
