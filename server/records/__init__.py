"""The HTTP API over what Vigil recorded and was given: the events timeline (/api/events: clips, snapshots),
enrolled faces (/api/faces), and memory (/api/search, /api/collections). Handlers only: what they read (the
timeline store, the face gallery, the memory index) lives in ``pipelines`` and is built by ``server.services`` and
``server.engines``."""
