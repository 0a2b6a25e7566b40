"""Admission: who a request is and when it may go. The tenants (keys, shares, quotas), the bounded queue
in front of each upstream's limiter and the permits it hands out, the order it admits in (priority
classes, fair shares), the reserve that keeps the top slots for a tenant under its share, and routing
among the upstreams that have room (prefix affinity weighed against load)."""
