"""nginx as a reverse proxy in front of the same upstream: the C floor the Python proxies are compared with.

Optional: used when an ``nginx`` binary is installed (Debian: ``apt-get install nginx-light``), skipped
with a note otherwise. One process (``master_process off``), so its CPU time is one pid's; no buffering
(``proxy_buffering off``), HTTP/1.1 keep-alive to the upstream, which is what a streaming LLM proxy needs.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from gateway.common.processes import RunningProcess, free_port, start_process

CONFIG = """\
worker_processes 1;
master_process off;
daemon off;
error_log stderr error;
pid {tmp}/nginx.pid;
worker_rlimit_nofile 65536;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    # llama-server closes a connection after every streamed reply while advertising keep-alive, and a
    # request sent on it then hangs or fails: streamed requests go upstream with "Connection: close" (as the
    # gateway sends them), the others on kept connections. The body is read before proxying, so the
    # map sees it.
    map $request_body $upstream_connection {{
        '~"stream"\\s*:\\s*true' close;
        default "";
    }}
    upstream backend {{
        server {upstream_host}:{upstream_port} max_fails=0;
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection $upstream_connection;
            proxy_buffering off;
            proxy_read_timeout 300s;
            # A POST whose kept connection turns out closed fails before any byte: safe to resend.
            proxy_next_upstream error non_idempotent;
            proxy_next_upstream_tries 3;
        }}
    }}
}}
"""


def start_nginx(upstream: str) -> tuple[RunningProcess, str, tempfile.TemporaryDirectory] | None:
    """``(process, url, its temporary directory)``, or None when nginx is not installed. Ready once the
    upstream's ``/health`` answers through it."""
    binary = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
    if binary is None:
        return None
    tmp = tempfile.TemporaryDirectory(prefix="sweetspot-nginx-")
    target = urlsplit(upstream)
    port = free_port()
    conf = Path(tmp.name) / "nginx.conf"
    conf.write_text(CONFIG.format(tmp=tmp.name, upstream_host=target.hostname, upstream_port=target.port, port=port))
    url = f"http://127.0.0.1:{port}"
    try:
        proc = start_process([binary, "-c", str(conf), "-p", tmp.name], ready_url=f"{url}/health", timeout=10)
    except BaseException:
        tmp.cleanup()
        raise
    return proc, url, tmp
