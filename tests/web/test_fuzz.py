"""Property-based fuzzing of every route: no input gives a 5xx; every 4xx has the one shape."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuneplan.adapters.hub import parse_config_bytes
from tuneplan.errors import ModelConfigError

FUZZ = settings(max_examples=1000, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

values = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
                   st.sampled_from(["80GB", "1e999", "9" * 30, "-1", "h100", "0"]))
OFFER_KEYS = ["gpu", "min_gpu_memory", "count", "provider", "region", "spot", "max_price",
              "sort", "limit", "bogus"]
JOB_KEYS = ["model", "config", "seq_len", "batch_size", "method", "gpu", "tokens", "top",
            "lora_r", "precision", "bogus"]


def _check(response: Any) -> None:
    assert response.status_code < 500, response.text[:300]
    if response.status_code >= 400 and response.headers.get("content-type", "").startswith(
            "application/json"):
        detail = response.json()["detail"]
        assert isinstance(detail, list)
        assert all({"loc", "msg", "type"} <= set(item) for item in detail)


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
@settings(max_examples=1000, deadline=None)
def test_config_bytes_parse_or_refuse_in_one_line(data: bytes) -> None:
    try:
        assert isinstance(parse_config_bytes(data, origin="fuzz"), dict)
    except ModelConfigError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize("path", ["/api/offers", "/offers", "/api/gpus", "/api/catalog",
                                  "/api/models"])
@FUZZ
@given(params=st.dictionaries(st.sampled_from(OFFER_KEYS), values.map(str), max_size=5))
def test_get_routes_never_fail(client: TestClient, path: str, params: dict[str, str]) -> None:
    _check(client.get(path, params=params))


@pytest.mark.parametrize("path", ["/api/memory", "/api/plan"])
@FUZZ
@given(body=st.one_of(
    st.dictionaries(st.sampled_from(JOB_KEYS), values, max_size=5),
    st.binary(max_size=80)))
def test_post_routes_never_fail(client: TestClient, path: str, body: Any) -> None:
    # Mostly invalid bodies (they fail fast): a model that is not bundled, or bad JSON.
    if isinstance(body, bytes):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json={k: v for k, v in body.items() if k != "model"}
                               | {"model": str(body.get("model", "no-such-model"))})
    _check(response)


@FUZZ
@given(form=st.dictionaries(st.sampled_from(JOB_KEYS), values.map(str), max_size=5))
def test_html_plan_form_never_fails(client: TestClient, form: dict[str, str]) -> None:
    form.setdefault("model", "no-such-model")
    _check(client.post("/plan", data=form))
