"""HTTP plumbing every front-end shares: the route table (routes.py) and its OpenAPI document, errors rendered as
JSON, bearer-token auth, the probes (/healthz, /livez, /readyz) and how the app is served."""
