"""``python3 -m saltvirt.pki show|rotate-ca ...``: the CA's command line (``saltvirt.pki.ca``)."""

from saltvirt.pki.ca import main

raise SystemExit(main())
