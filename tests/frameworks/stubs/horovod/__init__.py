"""A stub of Horovod for tests: Horovod builds against MPI / NCCL and cannot be pip-installed
in CI. Only `horovod.torch` is provided (tests/frameworks/stubs/horovod/torch)."""

__version__ = "0.28.1-stub"
