"""Floor 1 of the gateway: the error hierarchy and its one mapping to responses, the API families
(`surface`), the Prometheus metrics, and the serving process's collector tuning. Imports nothing of the
gateway outside itself; every other layer may import it."""
