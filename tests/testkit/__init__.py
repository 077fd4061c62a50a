"""What the tests share: starting MPI jobs with a timeout (mpi_jobs), running in-rank suites
and reporting each rank's failures (rank_reports), container clusters (cluster) and the data
each rank contributes (rank_data). pytest puts tests/ on the path (pyproject's `pythonpath`),
so tests import these as `testkit.<module>`."""
