# The `cluster` and `operator` fixtures live in tests/conftest.py; re-exported for importers.
from tests.conftest import cluster, operator  # noqa: F401
