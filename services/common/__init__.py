"""Code shared by every service: the wire converters, the one error-mapping table, the transport
set a pool publishes and fetches through, and the server host (health, reflection, signals,
draining, metrics) that the role pools and the scheduler run inside."""
