from infra.bench.scheduler import run


def test_result_shape():
    out = run([8, 16], instances=5, seed=1, reps=2)
    assert set(out) == {"epochs", "oracle_gap"}
    assert set(out["epochs"]) == {"8", "16"}
    for row in out["epochs"].values():
        assert set(row) == {"sessions", "median_ms", "p99_ms"} and row["sessions"] > 0
    gap = out["oracle_gap"]
    assert gap["instances"] == 5 and 0.0 <= gap["mean_pct"] <= gap["max_pct"]
