"""What Vigil keeps: the events timeline (/api/events: clips, snapshots) and memory (/api/search,
/api/collections)."""
