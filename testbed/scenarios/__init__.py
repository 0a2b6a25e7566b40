"""The scenario harness: the pure controller against the simulator engine on virtual time, judged by an oracle."""
