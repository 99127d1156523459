"""Jobs and tasks: how keyturn moves one credential forward.

Each credential has one job (`job.CredentialJob`) and one private state record in Vault. A run
reads the record, asks each task when it is next due, takes the lease (a CAS write) if one is,
and runs the due tasks in order, each saving its progress through the `Journal`. The tasks are
`refresh.TokenRefresh` (OAuth tokens) and `rotation.KeyRotation` (keys and client secrets).
`build.build_job` makes a credential's job by its kind (`keyturn.kinds`), over one `JobDeps`.
"""
