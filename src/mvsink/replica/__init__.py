"""Running a view as a replica process: the stand-alone job (``job.py``) behind ``mvsink_job.py``."""
