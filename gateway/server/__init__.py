"""What ``sweetspot serve`` runs, in rooms in the order a request meets them.

``process/`` is the process and its front door (serving, workers, the front door's limits, the drain, logs,
the periodic loops); ``routes/`` the HTTP surface (the generation routes' path, light and ops routes, keys,
request bodies, error bodies); ``admission/`` who a request is and when it may go (tenants, the queue and
its limiters, the fair order, the reserve, routing among upstreams); ``upstream/`` the other side (the pool
of backends, the client, its headers, the health poll, response affinity); ``relay/`` the answer on its
way back (streaming, SSE and named-event filters, the request watch, measurement); ``feedback/`` what the
measurements drive (the control loop, start points, the replicas' share board). ``app.py`` wires them into
one app and ``parts.py`` builds the parts once from the settings.
"""
