"""What the tests share: starting MPI jobs with a timeout (mpi_jobs), the programs under
tests/jobs/ that tests run (programs), jobs stopped by a signal to the launcher (stopping) and
whether their processes are gone (processes), running in-rank suites and reporting each rank's
failures (rank_reports), container clusters (cluster), the data each rank contributes
(rank_data), and the in-rank TensorFlow and Keras suites' modes and callbacks
(tensorflow_modes, keras_callbacks). pytest puts tests/ on the path (pyproject's
`pythonpath`), so tests import these as `testkit.<module>`."""
