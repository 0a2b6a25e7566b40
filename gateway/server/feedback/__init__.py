"""What the measurements drive: the control loop that feeds each upstream's controller its window,
limiter numbers and headroom every tick and applies the decision; where controllers start (a sweep's
result); another algorithm named by a built-in name or an import path; and the replicas' share board in Redis."""
