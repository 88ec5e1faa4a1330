"""The root of the test tree.

Under pytest's default import mode (prepend), loading this file puts tests/ on ``sys.path``, so
tests in tests/integration/ can import the test-only helpers here (``workflow_check``); each test
folder's own helpers (``compat_support``, ``family_checks``, ...) resolve the same way. What the
benches share with the tests is the ``harness`` package, found from the repository root,
which ``python -m pytest`` (run there) puts on the path.
"""

import os

try:
    from hypothesis import settings
except ImportError:  # the property tests skip themselves (pytest.importorskip)
    pass
else:
    # "ci" (the default): the same examples in every run, so a failure reproduces; no example
    # database written into the tree; no per-example deadline (the machine may be shared).
    # HYPOTHESIS_PROFILE=explore: new random examples each run, failures kept in .hypothesis/.
    settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
    settings.register_profile("explore", deadline=None, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
