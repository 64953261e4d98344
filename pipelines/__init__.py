"""Video and voice pipelines: pure asyncio, no HTTP."""
