"""The upstream side: the pool of backends the gateway knows (limiter, window, health, models), the client
that sends a request and decides what a failure means (resend, fail over, or answer), the headers that go
upstream, the health poll, and which upstream holds each stored response."""
