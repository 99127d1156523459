"""Jobs and tasks: how keyturn moves one credential forward.

Each credential has one job (`job.CredentialJob`) and one private state record in Vault. A run
reads the record, asks each task when it is next due, takes the lease (a CAS write) if one is,
and runs the due tasks in order, each saving its progress through the `Journal`. The generic task
here is `rotation.KeyRotation` (keys and client secrets, over a kind's `RotationTarget`); a
kind's own tasks live with it (`keyturn.kinds.oauth_client.refresh.TokenRefresh`).
`keyturn.kinds.build_job` makes a credential's job by its kind, over one `JobDeps`. Nothing
here imports a kind.
"""
