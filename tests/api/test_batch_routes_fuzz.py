"""Schemathesis over the files, batches and job-list routes (the app on a real Redis, no worker):
whatever a client sends, the answer is never a 5xx and always matches the documented schema."""

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from api.app import create_app

pytestmark = pytest.mark.redis

ROUTES = r"^/v1/(files|batches|jobs$)"


@pytest.fixture
def app(make_settings):
    app = create_app(make_settings(default_model="m"))
    with TestClient(app):
        yield app


def test_no_request_gets_a_5xx(app, bearer):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app).include(path_regex=ROUTES)
    operations = [op.ok() for op in schema.get_all_operations() if op.ok().label != "POST /v1/jobs"]
    assert len(operations) == 10, [op.label for op in operations]

    for operation in operations:
        test = operation.as_strategy()

        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=test)
        def run(case):
            case.headers = {**(case.headers or {}), **bearer("alice")}
            response = case.call()
            assert response.status_code < 500, (case.method, case.path, response.text[:300])
            if response.status_code < 400:
                case.validate_response(response, checks=[schemathesis.checks.response_schema_conformance])

        run()
