"""The process and its front door: ``sweetspot serve``'s entry (``launch``), forked workers on one port,
the limits a client meets before the app (head size, read timeouts, the connection cap), the drain on
SIGTERM, the JSON logs and the periodic loops that run for the app's lifetime."""
