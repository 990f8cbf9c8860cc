"""The operations surface above the serve path: the admin API (replica state, drain, preemption
notices, the settings in force)."""
