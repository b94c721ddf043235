"""mvsink's differential tester: random SQL views over small TPC-H-shaped Delta sources
(:mod:`.tables`, :mod:`.grammar`), random source changes per time (:mod:`.changes`), every time
of every view as mvsink maintains it compared with Spark's full evaluation of the same SQL at
the same source versions (:mod:`.runner`), failures shrunk to a reproduction (:mod:`.shrink`).

``tests/test_differential.py`` runs fixed seeds; ``python -m tests.differential --minutes N``
runs random ones until the time is up (:mod:`.__main__`)."""
