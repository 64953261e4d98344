"""The ``vigil`` command: serve, config show, analyze, replay, transcribe, export-detector, drain."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from models.packaged import ModelNotAvailable
from server import __version__
from server.cli.transcribe import add_transcribe_command
from server.config import ConfigError, Settings, load_settings


def _add_config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML or TOML config file")


def _settings(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> Settings:
    return load_settings(args.config, overrides)


def _serve(args: argparse.Namespace) -> int:
    from server.app import run

    server: dict[str, Any] = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    overrides: dict[str, Any] = {"server": server} if server else {}
    if args.media_root is not None:
        overrides["sources"] = {"media_root": args.media_root}
    if args.grpc_port is not None:
        overrides["grpc"] = {"port": args.grpc_port}
    settings = _settings(args, overrides)
    run(settings)
    return 0


def _config_show(args: argparse.Namespace) -> int:
    settings = _settings(args)
    print(json.dumps(settings.masked(), indent=2, default=str))
    return 0


def _analyze(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from server.cli.analyze import analyze_file
    from server.engines import Engines

    overrides = {"video": {"target_fps": args.fps}} if args.fps else None
    settings = _settings(args, overrides)
    if not args.file.is_file():
        print(f"vigil analyze: no such file: {args.file}", file=sys.stderr)
        return 2
    out = open(args.output, "w") if args.output else sys.stdout
    bar = tqdm(total=None, unit="s", desc=args.file.name, file=sys.stderr, disable=args.quiet,
               bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} s [{elapsed}<{remaining}]")
    state_detail: dict[str, Any] = {}

    def write(message: Any) -> None:
        out.write(message.model_dump_json(exclude_none=True) + "\n")
        if message.type == "event" and message.name == "source.state":
            state_detail.update(message.data)

    def progress(seconds: float, duration: float | None) -> None:  # called from the reader thread
        if duration and bar.total is None:
            bar.total = round(duration, 1)
        if seconds > bar.n:  # audio and video interleave; only move forward
            bar.update(seconds - bar.n)

    # A file no demuxer opens fails the same way without the models: in a second or two, not after they load.
    engines = Engines(settings) if _opens(args.file) else None
    try:
        state = asyncio.run(analyze_file(args.file, settings, write, engines, on_progress=progress,
                                         events_dir=args.events_dir))
    finally:
        bar.close()
        if out is not sys.stdout:
            out.close()
    if state.value != "ended":
        print(f"vigil analyze: {state.value}: {state_detail.get('reason', '')}", file=sys.stderr)
        return 1
    return 0


def _opens(path: Path) -> bool:
    import av

    try:
        with av.open(str(path)):
            return True
    except (av.FFmpegError, OSError):
        return False


def _replay(args: argparse.Namespace) -> int:
    from server.cli.client import replay
    from server.media.ice import restrict_host_addresses

    settings = _settings(args)
    restrict_host_addresses(settings.webrtc.host_addresses)
    options = {"video": {"target_fps": args.fps}} if args.fps else None
    asyncio.run(replay(str(args.file), args.url, token=args.token, options=options, max_seconds=args.seconds))
    return 0


def _export_detector(args: argparse.Namespace) -> int:
    from models.detectors.triton import export_model_repository

    detector = _settings(args).models.detector
    triton = getattr(detector, "triton", None)  # the triton backend's own section, if configured
    name = args.name or (triton.model if triton else "yolo")
    model_dir = export_model_repository(getattr(detector, "weights", None), str(args.repository), name=name,
                                        imgsz=args.imgsz or getattr(detector, "imgsz", 640), max_batch=args.max_batch,
                                        gpu=not args.cpu)
    print(model_dir)
    return 0


def _drain(args: argparse.Namespace) -> int:
    """Ask a running cluster node to hand its sources over to the others (then it can be stopped)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{args.url.rstrip('/')}/api/cluster/drain", method="POST", data=b"")
    if args.token:
        request.add_header("Authorization", f"Bearer {args.token}")
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            result = json.loads(response.read())
    except urllib.error.HTTPError as error:
        print(f"vigil drain: {error.code} {error.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"vigil drain: cannot reach {args.url}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0 if not result.get("not_taken") else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vigil", description="Real-time multimodal stream analysis server.")
    parser.add_argument("--version", action="version", version=f"vigil {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the server")
    _add_config_arg(serve)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--media-root", type=Path, help="directory file sources may read")
    serve.add_argument("--grpc-port", type=int, help="port of the gRPC InferenceService (grpc.port)")
    serve.set_defaults(run=_serve)

    config = commands.add_parser("config", help="configuration")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the effective config, secrets masked")
    _add_config_arg(show)
    show.set_defaults(run=_config_show)

    analyze = commands.add_parser("analyze", help="run the pipelines over a file (no network), JSON lines out")
    _add_config_arg(analyze)
    analyze.add_argument("file", type=Path)
    analyze.add_argument("-o", "--output", type=Path, help="write JSON lines here (default: stdout)")
    analyze.add_argument("--fps", type=float, help="target analysis FPS")
    analyze.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    analyze.add_argument("--events-dir", type=Path,
                         help="also store the events with clips and snapshots here (a storage.data_dir)")
    analyze.set_defaults(run=_analyze)

    replay = commands.add_parser("replay", help="stream a file into a running server over WebRTC")
    _add_config_arg(replay)
    replay.add_argument("file", type=Path)
    replay.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
    replay.add_argument("--token", help="auth token, if the server needs one")
    replay.add_argument("--fps", type=float, help="target analysis FPS for this session")
    replay.add_argument("--seconds", type=float, help="stop after this long")
    replay.set_defaults(run=_replay)

    export = commands.add_parser(
        "export-detector", help="write a Triton model repository (ONNX, dynamic batch, config.pbtxt) for the "
        "configured detector weights")
    _add_config_arg(export)
    export.add_argument("repository", type=Path, help="model repository folder (created if missing)")
    export.add_argument("--name", help="model name (default: models.detector.triton.model)")
    export.add_argument("--imgsz", type=int, help="input size (default: models.detector.imgsz)")
    export.add_argument("--max-batch", type=int, default=16, help="Triton max_batch_size (default 16)")
    export.add_argument("--cpu", action="store_true", help="instance_group KIND_CPU instead of KIND_GPU")
    export.set_defaults(run=_export_detector)

    drain = commands.add_parser("drain", help="hand a cluster node's sources over to the other nodes")
    drain.add_argument("--url", required=True, help="the node's base URL, e.g. http://10.0.0.5:8080")
    drain.add_argument("--token", help="auth token, if the node needs one")
    drain.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the hand-over")
    drain.set_defaults(run=_drain)

    add_transcribe_command(commands, _add_config_arg)  # vigil transcribe FILE...
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_by_default = args.command in ("analyze", "replay", "transcribe")  # their stdout/stderr are the product
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if quiet_by_default else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return args.run(args)
    except (ConfigError, ModelNotAvailable) as error:
        print(f"vigil: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
