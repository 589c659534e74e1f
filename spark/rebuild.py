"""The batch job: every view rebuilt from offset 0: `spark-submit spark/rebuild.py --config cdc.yaml --warehouse DIR`.

Also runs as `python spark/rebuild.py ...`. Options: `python -m cdc_views rebuild --help` (PYTHONPATH=spark).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cdc_views.cli import main

raise SystemExit(main(["rebuild", *sys.argv[1:]]))
