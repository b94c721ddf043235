"""The Spark session mvsink runs in, with the Delta Lake jars on its class path.

The Delta jars are resolved once with Maven into a cache folder (``MVSINK_JARS_DIR``, default
``~/.cache/mvsink/jars/<delta version>``) and handed to Spark with ``spark.jars``; only the jars
that pyspark does not already ship are kept, so nothing on Spark's own class path is shadowed.
Resolution runs under a file lock, so several replicas starting at once resolve once.

Under ``spark-submit`` the driver's class path is fixed before Python runs, so hand the jars to
spark-submit: ``spark-submit --jars "$(python -m mvsink.spark)" mvsink_job.py ...``.

S3: Spark reads ``s3a://`` (and ``s3://``) paths through Hadoop S3A. The ``hadoop-aws`` jar of the
Hadoop version pyspark ships, and its AWS SDK v2 ``bundle``, are resolved the same way into
``~/.cache/mvsink/jars/hadoop-aws-<version>`` and put on the driver's class path (the bundle is
large; the class path avoids copying it for every session). S3A is configured from the standard
AWS environment: ``AWS_ENDPOINT_URL`` (endpoint, path-style access), ``AWS_REGION``, and
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN`` when set (otherwise S3A's
default credential chain: profiles, instance and container roles). It is on when ``MVSINK_S3=1``,
or when ``MVSINK_S3`` is unset and one of ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_PROFILE``, ``AWS_WEB_IDENTITY_TOKEN_FILE``, ``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` is
set; ``MVSINK_S3=0`` turns it off. Under spark-submit: ``--jars "$(python -m mvsink.spark --s3)"``.

On a cluster the executors get what they need from the application: the jars from spark-submit's
``--jars``, the S3A settings as ``spark.hadoop.*``, and the AWS environment their Python tasks use
(staging writes through pyarrow, :mod:`mvsink.storage`) as ``spark.executorEnv.*``.
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
<groupId>mvsink</groupId><artifactId>jars</artifactId><version>1</version>
<dependencies><dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>
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
    return _jars("io.delta", artifact, DELTA_VERSION, jars_dir)


def hadoop_version() -> str:
    """The Hadoop version pyspark ships (from its ``hadoop-client-api`` jar)."""
    for jar in os.listdir(_spark_jars_dir()):
        match = re.fullmatch(r"hadoop-client-api-(\d[\w.\-]*)\.jar", jar)
        if match:
            return match.group(1)
    raise RuntimeError(f"no hadoop-client-api jar in {_spark_jars_dir()}: cannot pick a hadoop-aws version")


def s3a_jars() -> list[str]:
    """Paths of ``hadoop-aws`` and its AWS SDK bundle (those missing from pyspark), resolving once."""
    version = hadoop_version()
    default_dir = Path.home() / ".cache" / "mvsink" / "jars" / f"hadoop-aws-{version}"
    jars_dir = Path(os.environ.get("MVSINK_S3A_JARS_DIR", default_dir))
    return _jars("org.apache.hadoop", "hadoop-aws", version, jars_dir)


def _jars(group: str, artifact: str, version: str, jars_dir: Path) -> list[str]:
    jars_dir.mkdir(parents=True, exist_ok=True)
    done = jars_dir / ".resolved"
    with open(jars_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _resolve(group, artifact, version, jars_dir)
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


def _resolve(group: str, artifact: str, version: str, jars_dir: Path) -> None:
    log.info("resolving %s:%s:%s with Maven into %s", group, artifact, version, jars_dir)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pom.xml").write_text(_POM.format(group=group, artifact=artifact, version=version))
        result = subprocess.run(
            ["mvn", "-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime",
             f"-DoutputDirectory={jars_dir}"],
            cwd=tmp, capture_output=True, text=True,
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"could not resolve {group}:{artifact}:{version} with Maven:\n"
            f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )


_S3_HINTS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
             "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")


def s3_enabled() -> bool:
    """Whether sessions get S3A (see the module doc)."""
    setting = os.environ.get("MVSINK_S3", "").strip().lower()
    if setting:
        return setting not in ("0", "false", "no", "off")
    return any(os.environ.get(name) for name in _S3_HINTS)


def s3a_conf() -> dict[str, str]:
    """Hadoop S3A settings from the standard AWS environment, as ``spark.hadoop.*`` settings."""
    conf = {
        "fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.s3a.endpoint.region": os.environ.get("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1")),
        # Bounded retries with backoff, in S3A and in the SDK under it.
        "fs.s3a.retry.limit": "5",
        "fs.s3a.retry.interval": "250ms",
        "fs.s3a.retry.throttle.limit": "8",
        "fs.s3a.retry.throttle.interval": "500ms",
        "fs.s3a.attempts.maximum": "3",
        "fs.s3a.connection.establish.timeout": "10s",
        "fs.s3a.connection.timeout": "60s",
    }
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        conf["fs.s3a.endpoint"] = endpoint
        conf["fs.s3a.path.style.access"] = "true"
        conf["fs.s3a.connection.ssl.enabled"] = "false" if endpoint.startswith("http://") else "true"
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        conf["fs.s3a.access.key"] = key
        conf["fs.s3a.secret.key"] = secret
        token = os.environ.get("AWS_SESSION_TOKEN")
        if token:
            conf["fs.s3a.session.token"] = token
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return {f"spark.hadoop.{k}": v for k, v in conf.items()}


def configure_s3a(spark) -> None:
    """Apply :func:`s3a_conf` to a running session's Hadoop configuration (the jars must be there)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_conf().items():
        hadoop.set(key[len("spark.hadoop."):], value)


#: The environment Python tasks need to reach S3 as the driver does (:mod:`mvsink.storage` in
#: staging), handed to executors with ``spark.executorEnv.*``.
_EXECUTOR_ENV = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_EC2_METADATA_DISABLED",
                 "MVSINK_S3_ATTEMPTS", "MVSINK_S3_MAX_BACKOFF")


def executor_env() -> dict[str, str]:
    """``spark.executorEnv.*`` settings carrying :data:`_EXECUTOR_ENV` (those set) to executors."""
    return {f"spark.executorEnv.{name}": os.environ[name] for name in _EXECUTOR_ENV if os.environ.get(name)}


def spark_session(app_name: str = "mvsink", extra_conf: dict[str, str] | None = None):
    """A local SparkSession with Delta enabled, sized for small machines (UI off, few partitions).

    Settings in ``extra_conf`` win; ``spark.master`` defaults to ``local[2]`` unless spark-submit
    already chose one. Under spark-submit the jars are spark-submit's (``--jars``): setting
    ``spark.jars`` here could not reach the driver's class path and would replace the list the
    executors fetch (on a cluster, executors would miss the S3A jars).
    """
    from pyspark.sql import SparkSession

    launched_by_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    conf = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
        "spark.driver.memory": "2g",
        "spark.sql.session.timeZone": "UTC",
        # Python workers that do not reread Spark's archives at every task (0.15-0.3 s each).
        "spark.python.daemon.module": "mvsink.worker_daemon",
    }
    if not launched_by_spark_submit:
        conf["spark.jars"] = ",".join(delta_jars())
    if s3_enabled():
        if not launched_by_spark_submit:
            # On the driver's class path (local mode runs the executors in the driver): no copy
            # of the large SDK bundle per session, as spark.jars would make.
            conf["spark.driver.extraClassPath"] = os.pathsep.join(s3a_jars())
        conf.update(s3a_conf())  # as spark.hadoop.*: reaches the executors' Hadoop configuration
    # Staging tasks reach S3 through pyarrow, whatever S3A's setting: the AWS environment they need.
    conf.update(executor_env())
    conf.update(extra_conf or {})
    # Python workers run this interpreter (with its packages), not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if not launched_by_spark_submit and "spark.master" not in conf:
        builder = builder.master("local[2]")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("MVSINK_SPARK_LOG_LEVEL", "ERROR"))
    return spark


if __name__ == "__main__":
    print(",".join(delta_jars() + (s3a_jars() if "--s3" in sys.argv[1:] else [])))
