"""HTTP fuzzing of the model server against its own OpenAPI schema (schemathesis).

Every generated request, valid or not, gets an answer that is not a 5xx and that conforms to
the schema the server publishes at /openapi.json. (schemathesis drives hypothesis directly
here: its pytest plugin does not load under this pytest.)
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.server.helpers import make_settings, running_server
from testsupport.onnx_models import affine_model

pytestmark = [pytest.mark.slow, pytest.mark.integration]
EXAMPLES_PER_OPERATION = 50


def test_fuzz_server_never_answers_5xx_and_keeps_its_schema(tmp_path) -> None:
    repo = tmp_path / "repo"
    rng = np.random.default_rng(3)
    affine_model(repo / "1" / "model.onnx", rng.standard_normal((4, 3)), rng.standard_normal(3))
    statuses: collections.Counter = collections.Counter()
    with running_server(make_settings(repo, max_body_bytes=64 * 1024)) as server:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 10  # both APIs, health and metadata are in the schema
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def fuzz(case) -> None:
                # A schema-valid body may still have the wrong shape for this model (the schema
                # cannot know the model): its 400 is right, so "positive data" is not checked.
                if case.path_parameters and "name" in case.path_parameters:
                    # Random names only meet the 404 path; the real one reaches the model.
                    case.path_parameters = {**case.path_parameters, "name": "tiny"}
                response = case.call_and_validate(excluded_checks=[positive_data_acceptance])
                statuses[response.status_code] += 1

            fuzz()
    assert not [code for code in statuses if code >= 500], statuses
    print(
        f"requests fuzzed: {sum(statuses.values())} over {len(operations)} operations; "
        f"status codes: {dict(sorted(statuses.items()))}"
    )
