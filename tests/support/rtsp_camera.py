#!/usr/bin/python3
"""A tiny real RTSP camera for tests, built on gst-rtsp-server.

Runs under Debian's system interpreter (/usr/bin/python3), which has the
GObject-introspection bindings; the project venv does not.  Serves a live
H.264 test pattern (and optionally Opus audio) at rtsp://127.0.0.1:PORT/PATH,
prints ``READY <url>`` once listening, and exits cleanly on SIGTERM/SIGINT.

    /usr/bin/python3 tests/support/rtsp_camera.py --port 8554 [--path /cam]
        [--width 320 --height 240 --fps 15] [--audio]
"""

from __future__ import annotations

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def build_launch(width: int, height: int, fps: int, audio: bool) -> str:
    # is-live=true so frames are paced in real time like a real camera;
    # pattern=ball + timeoverlay make every frame different.
    # zerolatency/ultrafast: no lookahead, no B-frames; key-int-max=fps gives
    # a keyframe about every second so a (re)connecting client starts fast.
    # config-interval=1 repeats SPS/PPS in-band before each keyframe.
    video = (
        f"videotestsrc is-live=true pattern=ball"
        f" ! video/x-raw,width={width},height={height},framerate={fps}/1"
        f" ! timeoverlay ! videoconvert"
        f" ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} bframes=0"
        f" ! video/x-h264,profile=constrained-baseline"
        f" ! rtph264pay name=pay0 pt=96 config-interval=1"
    )
    if not audio:
        return f"( {video} )"
    # Opus over RTP: FFmpeg/PyAV decodes it natively (encoding-name OPUS/48000/2).
    sound = (
        "audiotestsrc is-live=true wave=sine freq=440 volume=0.3"
        " ! audioconvert ! audioresample ! audio/x-raw,rate=48000,channels=2"
        " ! opusenc ! rtpopuspay name=pay1 pt=97"
    )
    return f"( {video} {sound} )"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", default="/cam")
    ap.add_argument("--width", type=int, default=320)
    ap.add_argument("--height", type=int, default=240)
    ap.add_argument("--fps", type=int, default=15)
    ap.add_argument("--audio", action="store_true")
    args = ap.parse_args(argv)
    path = args.path if args.path.startswith("/") else "/" + args.path

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")  # loopback only
    server.set_service(str(args.port))

    launch = build_launch(args.width, args.height, args.fps, args.audio)
    # The server builds the pipeline only when a client connects, and then answers a bare 5XX if an element's
    # plugin is missing; check the elements now so a missing apt package fails with its name.
    try:
        Gst.parse_launch(launch.strip("( )"))
    except GLib.Error as exc:
        print(f"rtsp_camera: cannot build the pipeline (missing GStreamer plugin?): {exc.message}",
              file=sys.stderr, flush=True)
        return 1
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch)
    # A pipeline per client, not one shared: gst-rtsp-server 1.22 aborts on a shared media that two clients set
    # up at once ("rtsp-media.c: gst_rtsp_media_get_rates: assertion failed"; about 1 in 30 here), which killed
    # the camera under two cluster nodes connecting together. A 320x240 x264 ultrafast encoder per client is cheap.
    factory.set_shared(False)
    server.get_mount_points().add_factory(path, factory)

    # attach() creates, binds (SO_REUSEADDR) and listens synchronously, so after
    # a non-zero id the port accepts connections; 0 means bind failed.
    if server.attach(None) == 0:
        print(f"rtsp_camera: cannot listen on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
        return 1

    loop = GLib.MainLoop()

    def on_signal(*_: object) -> bool:
        loop.quit()
        return GLib.SOURCE_REMOVE

    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, on_signal)

    print(f"READY rtsp://127.0.0.1:{args.port}{path}", flush=True)
    loop.run()
    # Exiting closes every socket; connected clients see EOF/reset at once.
    return 0


if __name__ == "__main__":
    sys.exit(main())
