"""The root of the test tree.

Under pytest's default import mode (prepend), loading this file puts tests/ on ``sys.path``, so
tests in tests/integration/ can import the test-only helpers here (``workflow_check``); each test
folder's own helpers (``compat_support``, ``family_checks``, ...) resolve the same way. What the
benches share with the tests is the ``bench.harness`` package, found from the repository root,
which ``python -m pytest`` (run there) puts on the path.
"""
