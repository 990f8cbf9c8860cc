"""The serve path's stores, each in memory with a Redis twin: idempotency keys, quarantined poison
fingerprints and their evidence, and the Responses API's stored-response records."""
