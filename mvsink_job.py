"""Entry point for ``spark-submit mvsink_job.py --config view.yaml [--read-only] [--replica-id ID]``.

Also runs as ``python mvsink_job.py ...`` (a local Spark), and ``python mvsink_job.py --example``
runs the built-in local example (see README).
"""

import sys

if __name__ == "__main__":
    if "--example" in sys.argv[1:]:
        from mvsink.example import main as example_main

        sys.exit(example_main([a for a in sys.argv[1:] if a != "--example"]))
    from mvsink.replica.job import main

    sys.exit(main())
