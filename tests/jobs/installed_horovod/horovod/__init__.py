"""A stand-in for a Horovod installed beside hvdplus: tests/test_horovod_compat.py puts
tests/jobs/installed_horovod on the path to check that the alias refuses to shadow it and
that horovodrun hands over to its launcher."""
