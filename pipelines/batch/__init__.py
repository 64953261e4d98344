"""Batch transcription: decoding uploads, the persisted job queue (SQLite) and its workers, output formats.

Pure asyncio + sqlite; no HTTP (``server/v1/audio.py`` serves it, ``vigil transcribe`` runs it in-process).
"""
