"""Elastic training jobs and the numpy replay their results are checked against. The jobs run
as scripts, here or mounted in containers, and import replay from their own folder; tests
import it as `elastic_jobs.replay` (tests/ is on pytest's path)."""
