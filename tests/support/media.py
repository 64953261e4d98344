"""Test media made on the spot with PyAV: no downloads."""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from aiortc import MediaStreamTrack


def make_clip(path: Path, seconds: float = 2.0, fps: int = 15, size: tuple[int, int] = (320, 240),
              audio: bool = True, video: bool = True, sample_rate: int = 48000) -> Path:
    """An MP4 (H.264 + AAC) with a moving bright square and a 440 Hz tone."""
    width, height = size
    with av.open(str(path), "w") as container:
        vstream = container.add_stream("libx264", rate=fps) if video else None
        if vstream is not None:
            vstream.width, vstream.height, vstream.pix_fmt = width, height, "yuv420p"
            vstream.options = {"preset": "ultrafast", "tune": "zerolatency"}
        astream = container.add_stream("aac", rate=sample_rate) if audio else None
        if astream is not None:
            astream.layout = "mono"
        frames = int(seconds * fps)
        for index in range(frames if vstream is not None else 0):
            picture = np.full((height, width, 3), 40, np.uint8)
            x = int((width - 40) * index / max(frames - 1, 1))
            picture[height // 2 - 20: height // 2 + 20, x: x + 40] = 230
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts, frame.time_base = index, Fraction(1, fps)
            for packet in vstream.encode(frame):
                container.mux(packet)
        if vstream is not None:
            for packet in vstream.encode():
                container.mux(packet)
        if astream is not None:
            chunk = 1024
            total = int(seconds * sample_rate)
            for start in range(0, total, chunk):
                t = (np.arange(start, min(start + chunk, total)) / sample_rate).astype(np.float32)
                samples = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :]
                frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
                frame.sample_rate, frame.pts, frame.time_base = sample_rate, start, Fraction(1, sample_rate)
                for packet in astream.encode(frame):
                    container.mux(packet)
            for packet in astream.encode():
                container.mux(packet)
    return path


def real_image(name: str) -> np.ndarray:
    """RGB arrays of real photographs that ship inside installed packages (no downloads)."""
    if name in ("bus", "zidane"):
        import cv2
        from ultralytics.utils import ASSETS

        return cv2.cvtColor(cv2.imread(str(ASSETS / f"{name}.jpg")), cv2.COLOR_BGR2RGB)
    if name == "grace_hopper":  # a portrait in matplotlib's sample data
        import cv2
        import matplotlib

        path = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
        return cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
    import skimage.data

    image = getattr(skimage.data, name)()
    return np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image  # camera is greyscale


def letterbox(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Fit ``image`` into a (width, height) canvas, keeping its aspect ratio."""
    import cv2

    width, height = size
    scale = min(width / image.shape[1], height / image.shape[0])
    resized = cv2.resize(image, (int(image.shape[1] * scale), int(image.shape[0] * scale)))
    canvas = np.full((height, width, 3), 114, np.uint8)
    y, x = (height - resized.shape[0]) // 2, (width - resized.shape[1]) // 2
    canvas[y: y + resized.shape[0], x: x + resized.shape[1]] = resized
    return canvas


def write_video(
    path: Path,
    pictures: list[np.ndarray],
    fps: int,
    *,
    codec: str = "libx264",
    container_format: str | None = None,
    options: dict[str, str] | None = None,
) -> Path:
    """A video from RGB frames (all one size): H.264 MP4 by default; ``codec="rawvideo"`` with
    ``container_format="yuv4mpegpipe"`` writes a .y4m."""
    height, width = pictures[0].shape[:2]
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "18"} if options is None else options
        for index, picture in enumerate(pictures):
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts, frame.time_base = index, Fraction(1, fps)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def slideshow(path: Path, segments: list[tuple[str, float]], fps: int = 10, size: tuple[int, int] = (640, 480)
              ) -> Path:
    """Real photographs one after another: [(image name, seconds), ...]."""
    pictures: list[np.ndarray] = []
    for name, seconds in segments:
        picture = letterbox(real_image(name), size)
        pictures += [picture] * round(seconds * fps)
    return write_video(path, pictures, fps)


def sliding_person(path: Path, seconds: float = 6.0, fps: int = 10, size: tuple[int, int] = (960, 480),
                   options: dict[str, str] | None = None) -> Path:
    """One person (cut from zidane.jpg) moving left to right across a plain background at constant speed;
    ``options``: the H.264 encoder's (e.g. a short GOP)."""
    width, height = size
    person = real_image("zidane")[60:720, 700:1130]  # the man on the right, head to knees
    scale = (height - 40) / person.shape[0]
    import cv2

    person = cv2.resize(person, (int(person.shape[1] * scale), height - 40))
    frames = int(seconds * fps)
    pictures = []
    for index in range(frames):
        canvas = np.full((height, width, 3), 160, np.uint8)
        x = int((width - person.shape[1]) * index / (frames - 1))
        canvas[20: 20 + person.shape[0], x: x + person.shape[1]] = person
        pictures.append(canvas)
    return write_video(path, pictures, fps, options=options)



def keyframed_sliding_person(path: Path) -> Path:
    """:func:`sliding_person` for 6 s at 10 fps with a keyframe every 0.5 s: a clip starts at the keyframe at or
    before its ``pre_s``, so it starts close to it."""
    return sliding_person(path, seconds=6.0, fps=10, options={"preset": "ultrafast", "g": "5"})


def precoded_vp8(size: tuple[int, int], fps: int) -> list[bytes]:
    """The clip (3 s of bus.jpg, 3 s of zidane.jpg), VP8-encoded ONCE here, a keyframe every second (so a loop
    restarts on a keyframe, and a receiver that lost a packet recovers within a second)."""
    pictures = [letterbox(real_image(name), size) for name in ("bus", "zidane") for _ in range(3 * fps)]
    codec = av.CodecContext.create("libvpx", "w")
    codec.width, codec.height, codec.pix_fmt = size[0], size[1], "yuv420p"
    codec.time_base, codec.framerate, codec.gop_size = Fraction(1, fps), Fraction(fps), fps
    codec.bit_rate = 1_000_000
    packets: list[bytes] = []
    for index, picture in enumerate(pictures):
        frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
        frame.pts, frame.time_base = index, Fraction(1, fps)
        packets += [bytes(packet) for packet in codec.encode(frame)]
    packets += [bytes(packet) for packet in codec.encode(None)]
    assert len(packets) == len(pictures), "one VP8 packet per picture"
    return packets


class PrecodedVideoTrack(MediaStreamTrack):
    """A camera that costs the client nothing: pre-encoded VP8 packets, looped, paced at ``fps`` on a fixed
    schedule (a late send is followed by the next on time, never by a burst), timestamps always increasing.
    aiortc's sender packetizes an ``av.Packet`` without encoding it. Counts what it sent."""

    kind = "video"

    def __init__(self, packets: list[bytes], fps: int) -> None:
        super().__init__()
        self.packets, self.fps = packets, fps
        self.index = 0
        self.started: float | None = None
        self.sent: list[float] = []

    async def recv(self) -> av.Packet:
        loop = asyncio.get_running_loop()
        if self.started is None:
            self.started = loop.time()
        due = self.started + self.index / self.fps
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        elif loop.time() - due > 1.0:  # more than a second behind (a starved client): skip ahead to a keyframe
            self.index += self.fps - self.index % self.fps
        packet = av.Packet(self.packets[self.index % len(self.packets)])
        packet.pts, packet.time_base = self.index, Fraction(1, self.fps)
        self.index += 1
        self.sent.append(time.perf_counter())
        return packet
