"""``python -m cdc_views COMMAND``: see ``cdc_views.cli``."""

from cdc_views.cli import main

raise SystemExit(main())
