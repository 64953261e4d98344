"""``vigil transcribe --url URL FILE...``: the files become transcription jobs of a running Vigil server.

Every file is submitted first (so the server's queue holds them all), then each job is followed to its end
with a progress bar fed by the job's status (``progress.audio_seconds_done`` of ``duration``), and its result
is fetched in the requested format. The server does the work; this side only uploads and polls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

JOBS_PATH = "/v1/audio/transcriptions/jobs"
TERMINAL_STATUSES = ("completed", "failed", "cancelled")
MAX_RETRIES = 30
MAX_RETRY_AFTER_S = 60.0


class RemoteError(Exception):
    """The server refused a request or could not be reached; the message is for the user."""


def run_remote_transcribe(args: argparse.Namespace) -> int:
    """Exit status: 0 all files done, 1 some file failed, 2 the server cannot be used at all."""
    try:
        return asyncio.run(_transcribe_all(args))
    except RemoteError as error:
        print(f"vigil transcribe: {error}", file=sys.stderr)
        return 2


async def _transcribe_all(args: argparse.Namespace) -> int:
    base = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.output_dir:
        args.output_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                                     raise_for_status=False) as http:
        submitted: list[tuple[Path, dict[str, Any]]] = []
        for path in args.files:
            try:
                submitted.append((path, await _submit(http, base, path, args)))
            except (OSError, RemoteError) as error:
                if isinstance(error, RemoteError) and error.args[0].startswith(("401", "403")):
                    raise  # a wrong key fails every file the same way
                print(f"vigil transcribe: {path}: {error}", file=sys.stderr)
                failed += 1
        for path, job in submitted:
            job = await _follow(http, base, path, job, args)
            if job["status"] != "completed":
                reason = (job.get("error") or {}).get("message") or job["status"]
                print(f"vigil transcribe: {path}: job {job['id']} {job['status']}: {reason}", file=sys.stderr)
                failed += 1
                continue
            _write(path, await _result(http, base, job["id"], args.response_format), args)
    return 1 if failed else 0


async def _submit(http: aiohttp.ClientSession, base: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    with contextlib.ExitStack() as opened:
        def make_form() -> aiohttp.FormData:  # a fresh form per attempt: a sent one cannot be sent again
            audio = opened.enter_context(path.open("rb"))  # streamed, not read into memory; missing: OSError
            form = aiohttp.FormData()
            form.add_field("file", audio, filename=path.name, content_type="application/octet-stream")
            form.add_field("model", args.model)
            if args.language:
                form.add_field("language", args.language)
            if args.prompt:
                form.add_field("prompt", args.prompt)
            return form

        return await _request(http, "POST", f"{base}{JOBS_PATH}", make_form=make_form)


async def _follow(http: aiohttp.ClientSession, base: str, path: Path, job: dict[str, Any],
                  args: argparse.Namespace) -> dict[str, Any]:
    """Poll the job until it ends, drawing its progress (audio seconds) on stderr."""
    from tqdm import tqdm

    with tqdm(total=round(job["duration"], 1), unit="s", desc=path.name, file=sys.stderr, disable=args.quiet,
              bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}] {postfix}") as bar:
        while True:
            done = job["duration"] if job["status"] == "completed" else job["progress"]["audio_seconds_done"]
            bar.update(round(min(done, job["duration"]), 1) - bar.n)
            bar.set_postfix_str(job["status"], refresh=True)
            if job["status"] in TERMINAL_STATUSES:
                return job
            await asyncio.sleep(args.poll_interval)
            job = await _request(http, "GET", f"{base}{JOBS_PATH}/{job['id']}")


async def _result(http: aiohttp.ClientSession, base: str, job_id: str, response_format: str) -> str:
    return await _request(http, "GET", f"{base}{JOBS_PATH}/{job_id}/result", as_text=True,
                          params={"response_format": response_format})


async def _request(http: aiohttp.ClientSession, method: str, url: str, *, as_text: bool = False,
                   make_form: Callable[[], aiohttp.FormData] | None = None, **kwargs: Any) -> Any:
    """The JSON (or text) answer; a 429 (the API's rate limit counts status reads too) or a 503 (queue full,
    server busy) is retried after its ``Retry-After``, up to ``MAX_RETRIES`` times."""
    for attempt in range(MAX_RETRIES + 1):
        if make_form is not None:
            kwargs["data"] = make_form()
        try:
            async with http.request(method, url, **kwargs) as reply:
                if reply.status in (429, 503) and attempt < MAX_RETRIES and "Retry-After" in reply.headers:
                    delay = _retry_after_s(reply.headers["Retry-After"])
                else:
                    if reply.status >= 400:
                        raise RemoteError(await _error_message(reply))
                    return await reply.text() if as_text else await reply.json()
        except aiohttp.ClientError as error:
            raise RemoteError(f"cannot reach {url}: {error}") from None
        await asyncio.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _retry_after_s(header: str) -> float:
    try:
        return min(max(float(header), 0.1), MAX_RETRY_AFTER_S)
    except ValueError:
        return MAX_RETRY_AFTER_S


async def _error_message(reply: aiohttp.ClientResponse) -> str:
    """``STATUS message`` from an OpenAI-shaped error body (or the raw body)."""
    text = await reply.text()
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text.strip()[:200] or reply.reason
    return f"{reply.status} {message}"


def _write(path: Path, body: str, args: argparse.Namespace) -> None:
    from pipelines.batch.formats import FILE_EXTENSIONS

    if args.response_format in ("json", "verbose_json"):  # one JSON document per line, as in-process mode writes
        data = json.loads(body)
        data.pop("usage", None)
        if not args.output_dir and len(args.files) > 1:
            data = {"file": str(path), **data}
        body = json.dumps(data, ensure_ascii=False) + "\n"
    if args.output_dir:
        (args.output_dir / f"{path.stem}.{FILE_EXTENSIONS[args.response_format]}").write_text(body)
        return
    if len(args.files) > 1 and args.response_format not in ("json", "verbose_json"):
        sys.stdout.write(f"==> {path} <==\n")
    sys.stdout.write(body)
    sys.stdout.flush()
