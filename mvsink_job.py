"""Entry point for ``spark-submit mvsink_job.py --config view.yaml [--read-only] [--replica-id ID]``.

Also runs as ``python mvsink_job.py ...`` (a local Spark), and ``python mvsink_job.py --example``
runs the built-in local example (see README).
"""

import sys

if __name__ == "__main__":
    from mvsink.replica.job import main  # --example included (see --help)

    sys.exit(main())
