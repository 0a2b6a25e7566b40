"""The answer on its way back: a stream passed to the client chunk by chunk (SSE for chat and completions,
named events for the Responses and Messages APIs), timed and counted as it goes; the watch that ends a
request early (client gone, drain deadline, first token overdue); and the measurement that turns one
request into one sample for its upstream's window, its tenant and the metrics."""
