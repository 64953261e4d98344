"""Live media: WebRTC sessions (/offer, /api/sessions) and server-side sources (/api/sources: RTSP cameras, files),
their admission, ICE addresses, inbound jitter and the release of closed peer connections."""
