from infra.bench.scheduler import FAMILIES, SETTINGS, run


def test_result_shape():
    out = run([8, 16], instances=3, seed=1, reps=2)
    assert set(out) == {"rounds", "oracle_gap", "settings", "not_covered"}
    for rows in out["rounds"].values():
        assert set(rows) == {"8", "16"}
        for row in rows.values():
            assert set(row) == {"sessions", "migrations", "median_ms", "p99_ms"} and row["sessions"] > 0
    assert set(out["oracle_gap"]) == set(SETTINGS)
    for fams in out["oracle_gap"].values():
        assert set(fams) == set(FAMILIES)
        for gap in fams.values():
            assert gap["instances"] == 3 and 0.0 <= gap["mean_pct"] <= gap["max_pct"]
    assert out["settings"]["shipped"]["eta"] == 1.0
