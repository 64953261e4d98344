"""The OpenAI-compatible /v1 front-end: its ingress (keys, rate limits, sizes), chat (/v1/chat/completions,
/v1/models) and audio (/v1/audio/*); the chat service here is shared with gRPC Predict."""
