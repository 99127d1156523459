"""The service side: the OAuth token endpoint, probes, and (later) key rotators."""
