"""`python -m gateway` runs the same CLI as the `egress-gateway` script."""

from gateway.cli import main

raise SystemExit(main())
