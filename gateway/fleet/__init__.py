"""What concerns the fleet of gateway instances and replicas rather than one request: instance
membership, the autoscaling signal, prefix-index sharing between instances, and the alert rules."""
