"""Compare the views with the source database: `spark-submit spark/verify.py --config cdc.yaml --warehouse DIR`.

Exit status 1 when anything differs. Also runs as `python spark/verify.py ...`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cdc_views.cli import main

raise SystemExit(main(["verify", *sys.argv[1:]]))
