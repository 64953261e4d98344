"""HTTP plumbing every front-end shares: the ``Route`` row and the OpenAPI document built from a table of them
(the table itself is gathered in ``server.app``), errors rendered as JSON, bearer-token auth, the probes
(/healthz, /livez, /readyz) and how the app is served."""
