"""`target`: the view's Delta table as mvsink sees it, and as any other reader sees it.

One concept, one room; the data flow reaches it at its two ends (append writes it, the read-back
reads it):

* :mod:`~mvsink.target.layout`: what a reader sees at every version (the view's rows, or its
  updates), fixed when the table is created;
* :mod:`~mvsink.target.create`: the table made on a view's first write, checked at every start;
* :mod:`~mvsink.target.guard`: what a table must be for mvsink to commit to it and read it back,
  and the upper's history (it only grows);
* :mod:`~mvsink.target.commit_info`: the ``mvsink.*`` vocabulary each commit records of itself;
* :mod:`~mvsink.target.read`: the view at a time, the version that holds a time, its upper and
  since, its errors;
* :mod:`~mvsink.target.status`: the view's state from the table and its timeline alone.

Invariant: the view's *upper* is the version of the Delta ``txn`` action whose appId is the
view's; every time below it is final, and in the table layout every version an mvsink commit of
the view made for `[lower, upper)` reads, with no mvsink code, as the view at each of those times.
"""
