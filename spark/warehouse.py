"""The batch job for the warehouse view only: `spark-submit spark/warehouse.py --config cdc.yaml --warehouse DIR`.

Also runs as `python spark/warehouse.py ...`. Options: `python -m cdc_views rebuild --help` (PYTHONPATH=spark).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cdc_views.cli import main

raise SystemExit(main(["rebuild", "--views", "warehouse", *sys.argv[1:]]))
