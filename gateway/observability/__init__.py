"""Per-request observability: OpenTelemetry spans and the structured access log.

`observer.RequestObserver` is built by the composition root from the `tracing:` and `access_log:`
settings; it starts one `request_record.RequestRecord` per request at arrival. With both off the record
is a shared object whose hooks do nothing, so the serve path does no tracing or logging work. Requests
outside the serve path (operations routes, unknown routes, wrong methods) get their access-log line from
`ops_log.OpsLog`, built only when the access log is on.
"""
