"""The stand-in Hub as a fixture for every test of this directory."""

from tests.storage.test_model_fetch_hf import hub  # noqa: F401  (a fixture)
