"""Rotators: create a new key or client secret at the provider, and revoke an old one."""
