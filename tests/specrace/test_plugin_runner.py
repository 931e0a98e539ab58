"""The pytest plugin's fixtures, as a user's test would use them (on the simulator here;
the same tests run on a GPU with ``--specrace-backend cuda``)."""


def test_scenario_runner_reproduces_the_seed_race(scenario_runner, specrace_backend):
    res = scenario_runner("ngram-filter-race", variant="pre-fix", trials=2, expect="race")
    assert res["backend"] == specrace_backend
    assert res["outcome"] == "race" and res["matches_expectation"]
    assert res["first_divergence"] is not None or res["races"]


def test_scenario_runner_fixed_code_is_clean(scenario_runner):
    res = scenario_runner("ngram-filter-race", variant="fixed", trials=2)
    assert res["outcome"] == "clean" and res["reproduced"] == 0


def test_runtime_fixture_gives_a_device_with_streams(specrace_runtime):
    import torch
    rt = specrace_runtime
    s = rt.module.Stream()
    with rt.module.stream(s):
        x = torch.arange(4, device=rt.device) * 2
        assert x.tolist() == [0, 2, 4, 6]  # syncs s, the stream that computed it
