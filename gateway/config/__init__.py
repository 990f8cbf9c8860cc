"""Every settings model of the gateway (`settings.Settings` at the top, a pool's in `pool_settings`) and
the start-time checks across them. Imports only `gateway.base`."""
