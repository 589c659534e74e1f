"""The batch job for the search view only: `spark-submit spark/search_index.py --config cdc.yaml --warehouse DIR`.

Also runs as `python spark/search_index.py ...`. Options: `python -m cdc_views rebuild --help` (PYTHONPATH=spark).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cdc_views.cli import main  # noqa: E402

raise SystemExit(main(["rebuild", "--views", "search", *sys.argv[1:]]))
