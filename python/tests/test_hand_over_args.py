"""HandOver: the options `run_verifier(hand_over=...)` gives `quiesce verify`, and its refusals."""

from __future__ import annotations

from typing import Any

import pytest

from quiesce_harness import HandOver


def test_the_options_in_verifys_words() -> None:
    h = HandOver(
        protect=["/tests", "/app"],
        hide=["/tests"],
        services={9000: " ./api --port=9000 ", 8080: "python3 -m http.server 8080"},
        ports=[5000, 5000],
        service_user=65533,
        service_wait=5,
    )
    assert h.args() == [
        "--hand-over",
        "--service-user",
        "65533",
        "--service-wait",
        "5",
        "--protect",
        "/tests",
        "--protect",
        "/app",
        "--hide",
        "/tests",
        "--port",
        "5000",
        "--service",
        "8080=python3 -m http.server 8080",
        "--service",
        "9000=./api --port=9000",
    ]
    assert HandOver().args() == ["--hand-over"]


@pytest.mark.parametrize(
    "bad",
    [
        {"protect": "/tests"},
        {"protect": ["tests"]},
        {"hide": ["./x"]},
        {"ports": [0]},
        {"ports": [70000]},
        {"ports": [True]},
        {"services": {8080: "  "}},
        {"services": {0: "x"}},
        {"service_user": 0},
        {"service_wait": True},
    ],
)
def test_what_verify_would_refuse_is_refused_here(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="HandOver"):
        HandOver(**bad)
