"""The web's forms refuse what the CLI refuses, field by field (422 naming the field)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/api/plan", {"method": "full", "lora_rank": 8}, "lora_rank"),   # not a LoRA job
    ("/api/memory", {"method": "full", "lora_rank": 8}, "lora_rank"),  # not a LoRA job
    ("/api/memory", {"num_labels": 5}, "num_labels"),                  # not seq-cls
])
def test_a_flag_refused_on_the_cli_is_a_422_on_its_field(
        client: TestClient, path: str, body: dict[str, object], field: str) -> None:
    response = client.post(path, json={"model": "qwen2.5-0.5b", **body})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["body", field]
    assert f"--{field.replace('_', '-')}" in detail["msg"]


def test_the_plan_page_offers_no_field_the_planner_chooses(client: TestClient) -> None:
    page = client.get("/plan").text
    assert 'name="batch_size"' not in page and 'name="gradient_checkpointing"' not in page
