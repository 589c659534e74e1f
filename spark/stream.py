"""The continuous job: `spark-submit spark/stream.py --config cdc.yaml --warehouse DIR [--available-now]`.

Also runs as `python spark/stream.py ...`. Options: `python -m cdc_views stream --help` (PYTHONPATH=spark).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cdc_views.cli import main

raise SystemExit(main(["stream", *sys.argv[1:]]))
