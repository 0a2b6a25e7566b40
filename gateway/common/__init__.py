"""What the server and the tools share and neither owns: serving an ASGI app (uvicorn on uvloop, the
announcement line, the drain hook), the resend rule for a kept connection found closed, the header names
the gateway writes and the tools read, and the process manager the demo, the tests and the benchmarks
start servers with. Nothing here imports the server or a tool."""
