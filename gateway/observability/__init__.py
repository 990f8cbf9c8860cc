"""Per-request observability: the serve path's event port, OpenTelemetry spans and the access log.

`events.ServeEvents` is the port the serve path tells each event to, once; its subscribers
(`events.ServeEventSink`) are built by the composition root: the metrics (`gateway.proxy.account`), the
request's record (`record_events.RecordSink`) and the autoscaling signal (`gateway.fleet.autoscaling`).
`observer.RequestObserver` is built from the `tracing:` and `access_log:` settings; it starts one
`request_record.RequestRecord` per request at arrival. With both off the record is a shared object whose
hooks do nothing and the record sink is not subscribed, so the serve path does no tracing or logging
work. Requests outside the serve path (operations routes, unknown routes, wrong methods) get their
access-log line from `ops_log.OpsLog`, built only when the access log is on.
"""
