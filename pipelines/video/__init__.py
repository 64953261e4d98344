"""The video pipeline: batching, detection, tracking, zones, scene state."""
