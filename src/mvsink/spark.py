"""The Spark session mvsink runs in, with the Delta Lake jars on its class path.

The Delta jars are resolved once with Maven into a cache folder (``MVSINK_JARS_DIR``, default
``~/.cache/mvsink/jars/<delta version>``) and handed to Spark with ``spark.jars``; only the jars
that pyspark does not already ship are kept, so nothing on Spark's own class path is shadowed.
Resolution runs under a file lock, so several replicas starting at once resolve once.

Under ``spark-submit`` the driver's class path is fixed before Python runs, so hand the jars to
spark-submit: ``spark-submit --jars "$(python -m mvsink.spark)" mvsink_job.py ...``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

DELTA_VERSION = "4.4.0"
SCALA_VERSION = "2.13"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>mvsink</groupId><artifactId>delta-jars</artifactId><version>1</version>
<dependencies><dependency><groupId>io.delta</groupId><artifactId>{artifact}</artifactId>
<version>{version}</version></dependency></dependencies></project>
"""


def _spark_major_minor() -> str:
    import pyspark

    return ".".join(pyspark.__version__.split(".")[:2])


def _artifact_base(jar_name: str) -> str:
    """`parquet-hadoop-1.16.0.jar` -> `parquet-hadoop`."""
    return re.sub(r"-\d[\w.\-]*$", "", jar_name[: -len(".jar")])


def delta_jars() -> list[str]:
    """Paths of the Delta jars (and their dependencies missing from pyspark), resolving them once."""
    artifact = f"delta-spark_{_spark_major_minor()}_{SCALA_VERSION}"
    default_dir = Path.home() / ".cache" / "mvsink" / "jars" / f"{artifact}-{DELTA_VERSION}"
    jars_dir = Path(os.environ.get("MVSINK_JARS_DIR", default_dir))
    jars_dir.mkdir(parents=True, exist_ok=True)
    done = jars_dir / ".resolved"
    with open(jars_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _resolve(artifact, jars_dir)
            done.touch()
    spark_jars = {_artifact_base(j) for j in os.listdir(_spark_jars_dir())}
    return sorted(
        str(jars_dir / j)
        for j in os.listdir(jars_dir)
        if j.endswith(".jar") and _artifact_base(j) not in spark_jars
    )


def _spark_jars_dir() -> Path:
    """Spark's own jars: $SPARK_HOME/jars (as spark-submit sets it), else pyspark's."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(os.environ.get("SPARK_HOME") or _find_spark_home()) / "jars"


def _resolve(artifact: str, jars_dir: Path) -> None:
    log.info("resolving io.delta:%s:%s with Maven into %s", artifact, DELTA_VERSION, jars_dir)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pom.xml").write_text(_POM.format(artifact=artifact, version=DELTA_VERSION))
        result = subprocess.run(
            ["mvn", "-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime",
             f"-DoutputDirectory={jars_dir}"],
            cwd=tmp, capture_output=True, text=True,
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"could not resolve io.delta:{artifact}:{DELTA_VERSION} with Maven:\n"
            f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )


def spark_session(app_name: str = "mvsink", extra_conf: dict[str, str] | None = None):
    """A local SparkSession with Delta enabled, sized for small machines (UI off, few partitions).

    Settings in ``extra_conf`` win; ``spark.master`` defaults to ``local[2]`` unless spark-submit
    already chose one.
    """
    from pyspark.sql import SparkSession

    conf = {
        "spark.jars": ",".join(delta_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
        "spark.driver.memory": "2g",
        "spark.sql.session.timeZone": "UTC",
    }
    conf.update(extra_conf or {})
    # Python workers run this interpreter (with its packages), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    launched_by_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if not launched_by_spark_submit and "spark.master" not in conf:
        builder = builder.master("local[2]")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("MVSINK_SPARK_LOG_LEVEL", "ERROR"))
    return spark


if __name__ == "__main__":
    print(",".join(delta_jars()))
