"""Server-side media sources (RTSP cameras, recorded files)."""
