"""`kbroker bench --secure`: each row's secured figure against its plaintext one."""

from kbroker.bench.harness import secured_rows


def test_throughput_rows_give_secured_over_plaintext_and_latency_rows_the_inverse():
    plain = [
        {"scenario": "send", "unit": "msg/s", "kbroker": 1000.0, "range": {"kbroker": [900.0, 1100.0]}},
        {"scenario": "lat", "unit": "ms (p99)", "kbroker": 10.0},
        {"scenario": "failed", "unit": "msg/s", "kbroker": None},
    ]
    secured = [
        {
            "scenario": "send",
            "unit": "msg/s",
            "kbroker": 800.0,
            "baseline": 900.0,
            "range": {"kbroker": [700.0, 850.0]},
        },
        {"scenario": "lat", "unit": "ms (p99)", "kbroker": 20.0},
        {"scenario": "failed", "unit": "msg/s", "kbroker": 5.0},
    ]
    rows = {r["scenario"]: r for r in secured_rows(plain, secured)}
    assert set(rows) == {"send (TLS+SCRAM)", "lat (TLS+SCRAM)"}
    assert (rows["send (TLS+SCRAM)"]["ratio"], rows["send (TLS+SCRAM)"]["ratio_definition"]) == (
        0.8,
        "secured/plaintext",
    )
    assert (rows["lat (TLS+SCRAM)"]["ratio"], rows["lat (TLS+SCRAM)"]["ratio_definition"]) == (0.5, "plaintext/secured")
    assert rows["send (TLS+SCRAM)"]["baseline"] == 1000.0
    assert rows["send (TLS+SCRAM)"]["range"] == {"kbroker": [700.0, 850.0], "baseline": [900.0, 1100.0]}
