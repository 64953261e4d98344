"""``vigil transcribe FILE...``: transcribe files with the batch pipeline, with a progress bar: in-process (the
default), or with ``--url`` as jobs of a running server (``/v1/audio/transcriptions/jobs``), the progress read
from each job's status."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from server.config import load_settings


def add_transcribe_command(commands: Any, add_config_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    transcribe = commands.add_parser(
        "transcribe", help="transcribe audio files in-process (batched Whisper), or as jobs of a server (--url)")
    add_config_arg(transcribe)
    transcribe.add_argument("files", type=Path, nargs="+", metavar="FILE")
    transcribe.add_argument("-f", "--response-format", default="text",
                            choices=["json", "text", "verbose_json", "srt", "vtt"], help="output format")
    transcribe.add_argument("-o", "--output-dir", type=Path, help="write FILE's stem + format extension here "
                            "(default: stdout)")
    transcribe.add_argument("--language", default="en", help="ISO-639-1 code ('en'); multilingual models only")
    transcribe.add_argument("--prompt", help="text that steers spelling and style")
    transcribe.add_argument("--batch-size", type=int, help="chunks decoded per batch (transcription.batch_size)")
    transcribe.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    transcribe.add_argument("--url", help="submit the files as jobs to the Vigil server at this base URL "
                            "(e.g. http://127.0.0.1:8080) instead of transcribing in-process")
    transcribe.add_argument("--api-key", default=os.environ.get("VIGIL_API_KEY"),
                            help="the server's Bearer token (--url; default: $VIGIL_API_KEY)")
    transcribe.add_argument("--model", default="whisper-1", help="model name sent to the server (--url)")
    transcribe.add_argument("--poll-interval", type=float, default=1.0, help="seconds between job status reads "
                            "(--url)")
    transcribe.set_defaults(run=run_transcribe)


def run_transcribe(args: argparse.Namespace) -> int:
    """Transcribe files in-process with the batch pipeline (VAD-cut chunks decoded in batches), or with a server."""
    if args.url:
        from server.cli.transcribe_remote import run_remote_transcribe

        return run_remote_transcribe(args)
    from tqdm import tqdm

    from pipelines.batch.decode import AudioDecodeError, decode_audio_file
    from pipelines.batch.engine import transcribe_audio
    from pipelines.batch.formats import FILE_EXTENSIONS, as_json, as_text
    from server.engines import Engines

    overrides = {"transcription": {"batch_size": args.batch_size}} if args.batch_size else None
    settings = load_settings(args.config, overrides)
    config = settings.transcription
    model = Engines(settings).batch_stt()  # the same batch Whisper as `vigil serve`'s
    try:
        model.check_language(args.language)
    except ValueError as error:
        print(f"vigil transcribe: {error}", file=sys.stderr)
        return 2
    if args.output_dir:
        args.output_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for path in args.files:
        try:
            audio = decode_audio_file(path, config.max_job_audio_s)
        except (AudioDecodeError, OSError) as error:
            print(f"vigil transcribe: {path}: {error}", file=sys.stderr)
            failed += 1
            continue
        with tqdm(total=audio.size / 16_000, unit="s", desc=path.name, file=sys.stderr,
                  disable=args.quiet, bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}]") as bar:
            transcript = transcribe_audio(model, audio, language=args.language, prompt=args.prompt,
                                          batch_size=config.batch_size, max_chunk_s=config.max_chunk_s,
                                          max_cue_s=config.max_cue_s,
                                          on_progress=lambda seconds: bar.update(seconds))
        body = as_json(transcript, args.response_format)
        if body is not None:
            text = json.dumps(body if args.output_dir or len(args.files) == 1 else {"file": str(path), **body},
                              ensure_ascii=False) + "\n"
        else:
            text = as_text(transcript, args.response_format)
        if args.output_dir:
            (args.output_dir / f"{path.stem}.{FILE_EXTENSIONS[args.response_format]}").write_text(text)
        else:
            if len(args.files) > 1 and body is None:
                sys.stdout.write(f"==> {path} <==\n")
            sys.stdout.write(text)
            sys.stdout.flush()
    return 1 if failed else 0

