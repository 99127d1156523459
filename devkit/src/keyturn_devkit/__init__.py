"""keyturn's development kit, a second distribution (`keyturn-devkit`) beside the daemon's.

It serves and fakes secrets, so a production install (`pip install .`) never carries it:

    sandbox/ ...... the reference service (`keyturn sandbox`, `python -m keyturn_devkit.sandbox`)
    dev/ .......... real servers on loopback: dev OpenBao, a Raft cluster, TLS, Agent, the
                    sandbox as a process, Alertmanager
    harness/ ...... what the integration tests run around the daemon: a deployment on those
                    servers, the daemon as a process, app readers, a faulty Vault proxy, a
                    webhook receiver, a stepped wall clock
    demo.py ....... `keyturn demo`

In-memory fakes for unit tests stay in `keyturn.testing`.
"""
