"""Jobs and tasks: how keyturn moves one credential forward. One job per credential
(`job.CredentialJob`) over one private state record in Vault: a run takes the lease when a task
is due and runs the due tasks in order, each saving its progress through the `Journal`. The
generic task is `rotation.KeyRotation`; a kind's own tasks live with the kind. Nothing here
imports a kind (docs/architecture.md).
"""
