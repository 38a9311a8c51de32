"""The testing package: harnesses, fakes and fixtures that tests and benchmarks import.

Nothing here is a test, and no test module imports another test module: what two tests
share lives here. Importable as ``tests.support`` from the repository root (pytest puts
the root on the path; benchmarks run as ``python -m benchmarks.<name>``). It is not part
of the installed product.
"""
