"""benchmarks/demo_seeds.py's bookkeeping: which kernel families it offers and its verdict on the targets."""

from benchmarks import demo_seeds


def _run(seed, kernel, gain, wall=300.0, code=0):
    return {"seed": seed, "kernel": kernel, "exit": code, "wall_s": wall, "load_before": 1.0, "load_after": 1.0,
            "before": 0.1, "after": 0.1 + gain / 100 if gain is not None else None, "gain": gain, "tool_rate": 0.3}


def test_the_verdict_needs_every_gain_the_median_the_time_and_a_clean_exit(capsys):
    good = [_run(0, "native", 42.0), _run(1, "native", 25.0), _run(0, "avx2", 55.0)]
    assert demo_seeds.report(good)
    assert "targets (every gain >= 20, median >= 30, every run <= 600 s, exit 0): MET" in capsys.readouterr().out
    assert not demo_seeds.report([*good, _run(2, "native", 12.0)])
    assert "NOT MET: seed 2 native gained 12.0" in capsys.readouterr().out
    assert not demo_seeds.report([_run(0, "native", 25.0), _run(1, "native", 28.0)])
    assert "median gain 26.5" in capsys.readouterr().out
    assert not demo_seeds.report([*good, _run(0, "default", 40.0, wall=605.0)])
    assert "seed 0 default took 605 s" in capsys.readouterr().out
    assert not demo_seeds.report([*good, _run(3, "native", None, code=3)])
    assert "seed 3 native exited 3" in capsys.readouterr().out


def test_native_is_always_offered_and_forced_families_only_where_they_differ():
    families = demo_seeds.offered_families()
    assert families[0] == "native" and set(families) <= set(demo_seeds.FAMILIES)
    native = demo_seeds.native_family().lower()
    assert ("avx2" in families) == ("avx2" in demo_seeds.cpu_flags() and native != "avx2")
