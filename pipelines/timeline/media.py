"""Ring buffers of recent video and the clip/snapshot writers (blocking: run them on a thread).

Encoded sources (RTSP, files) keep the demuxed *packets*, grouped by keyframe, and a clip is a remux: no decoder or
encoder runs. WebRTC sessions deliver decoded frames only; they keep a few per second and a clip encodes them
(H.264 with libx264 when PyAV has it, else MPEG-4 Part 2).
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Iterable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np

from pipelines.video.frames import reformat, to_array

CLIP_ENCODER = "libx264" if "libx264" in av.codecs_available else "mpeg4"


class PacketTemplate:
    """The codec parameters of a live input stream, kept after its container closes.

    PyAV's ``add_stream_from_template`` needs an open stream (a closed one crashes the process), and an RTSP
    container closes on every reconnect. So the first keyframe is muxed into a small in-memory Matroska file,
    whose reopened stream serves as the template for every clip of this stream.
    """

    def __init__(self, stream: av.VideoStream, keyframe: av.Packet) -> None:
        buffer = io.BytesIO()
        with av.open(buffer, "w", format="matroska") as out:
            copy = _copy_packet(keyframe, 0, out.add_stream_from_template(stream))
            out.mux(copy)
        buffer.seek(0)
        self._container = av.open(buffer)
        self.stream = self._container.streams.video[0]
        self.codec = self.stream.codec_context.name
        # Never closed explicitly: clips being remuxed hold it, and the container closes with its last holder.


def _copy_packet(packet: av.Packet, shift: int, stream: Any) -> av.Packet:
    """A copy for muxing (muxing consumes a packet, and ring packets may go into several clips)."""
    copy = av.Packet(bytes(packet))
    copy.pts = None if packet.pts is None else packet.pts - shift
    copy.dts = None if packet.dts is None else packet.dts - shift
    copy.time_base = packet.time_base
    copy.is_keyframe = packet.is_keyframe
    copy.stream = stream
    return copy


class PacketRing:
    """The last ``keep_s`` seconds of packets, whole GOPs: the oldest kept packet is always a keyframe, at or
    before ``latest - keep_s``. Not thread-safe (the recorder holds its lock)."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._gops: deque[list[tuple[float, av.Packet]]] = deque()

    def clear(self) -> None:
        self._gops.clear()

    def append(self, seconds: float, packet: av.Packet) -> None:
        if packet.is_keyframe:
            self._gops.append([])
        elif not self._gops:
            return  # nothing decodable before the first keyframe
        self._gops[-1].append((seconds, packet))
        horizon = seconds - self.keep_s
        while len(self._gops) > 1 and self._gops[1][0][0] <= horizon:
            self._gops.popleft()

    def since(self, start: float) -> list[tuple[float, av.Packet]]:
        """Packets from the last keyframe at or before ``start`` (or the oldest one kept) to the newest."""
        gops = list(self._gops)
        first = 0
        for index, gop in enumerate(gops):
            if gop[0][0] <= start:
                first = index
        return [item for gop in gops[first:] for item in gop]


class FrameRing:
    """Decoded frames at ``fps`` at most (by media time), for the last ``keep_s`` seconds."""

    def __init__(self, keep_s: float, fps: float) -> None:
        self.keep_s, self.interval = keep_s, 1.0 / fps
        self._frames: deque[tuple[float, av.VideoFrame]] = deque()
        self._next_due: float | None = None

    def due(self, seconds: float) -> bool:
        if self._next_due is not None and seconds + 1e-3 < self._next_due:
            return False
        self._next_due = max((self._next_due or seconds) + self.interval, seconds + self.interval / 2)
        return True

    def append(self, seconds: float, frame: av.VideoFrame) -> None:
        self._frames.append((seconds, frame))
        while self._frames and self._frames[0][0] < seconds - self.keep_s:
            self._frames.popleft()

    def since(self, start: float) -> list[tuple[float, av.VideoFrame]]:
        return [(t, f) for t, f in self._frames if t >= start]


def remux_clip(path: Path, template: PacketTemplate, packets: Sequence[tuple[float, av.Packet]]) -> float:
    """Write ``packets`` (starting at a keyframe) into an MP4 as they are; returns the clip's duration."""
    first = packets[0][1]
    shift = first.dts if first.dts is not None else (first.pts or 0)
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream_from_template(template.stream)
        for _, packet in packets:
            if packet.dts is None and packet.pts is None:
                continue
            out.mux(_copy_packet(packet, shift, stream))
    return packets[-1][0] - packets[0][0]


def encode_clip(path: Path, frames: Sequence[tuple[float, av.VideoFrame]]) -> float:
    """Encode decoded frames (timestamps in seconds) into an MP4; returns the clip's duration."""
    width, height = frames[0][1].width // 2 * 2, frames[0][1].height // 2 * 2
    origin = frames[0][0]
    time_base = Fraction(1, 1000)
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream(CLIP_ENCODER, rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = time_base
        stream.codec_context.time_base = time_base
        if CLIP_ENCODER == "libx264":
            stream.options = {"preset": "ultrafast", "crf": "26"}
        last_pts = -1
        for seconds, frame in frames:
            picture = reformat(frame, width=width, height=height, format="yuv420p")
            pts = max(round((seconds - origin) * 1000), last_pts + 1)
            picture.pts, picture.time_base, last_pts = pts, time_base, pts
            for packet in stream.encode(picture):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return frames[-1][0] - origin


def write_snapshot(path: Path, frame: av.VideoFrame, objects: Iterable[dict[str, Any]]) -> None:
    """The event frame as a JPEG with its detections' boxes and labels drawn."""
    picture = np.ascontiguousarray(to_array(frame, "bgr24"))
    height, width = picture.shape[:2]
    for obj in objects:
        x1, y1, x2, y2 = obj["box"]
        top_left, bottom_right = (int(x1 * width), int(y1 * height)), (int(x2 * width), int(y2 * height))
        cv2.rectangle(picture, top_left, bottom_right, (0, 200, 255), 2)
        caption = obj["label"] + (f" #{obj['track_id']}" if obj.get("track_id") else "")
        cv2.putText(picture, caption, (top_left[0] + 2, max(top_left[1] - 4, 12)), cv2.FONT_HERSHEY_SIMPLEX, 0.5,
                    (0, 200, 255), 1, cv2.LINE_AA)
    ok, encoded = cv2.imencode(".jpg", picture, [cv2.IMWRITE_JPEG_QUALITY, 85])
    if not ok:
        raise ValueError("JPEG encoding failed")
    path.write_bytes(encoded.tobytes())
