"""bk's storage analytics on Spark (docs/ANALYTICS.md).

Its own layer: it imports bk's layout package (bk.formats), the pure usage
reader (bk.entrylog.usage), bk.meta's public API and the CLI's progress helper, never bk._native, the server or kazoo (tests/unit/test_layers.py).

    from spark.session import get_session     # SparkSession with the data sources registered
    spark.read.format("bk_entry_logs") ...    # spark.sources: bk_entry_logs, bk_ledgers, bk_remote_entry_logs
    python -m spark.gc_job --help             # the GC analytics job (= `bk analytics gc`, spark-submit-able)
    python -m spark.synth --help              # synthetic bookie directories
"""
