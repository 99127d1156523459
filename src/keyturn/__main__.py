"""`python -m keyturn` is the same as the `keyturn` command."""

from keyturn.cli import main

raise SystemExit(main())
