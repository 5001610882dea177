"""The torch-free config name lists must equal the algorithm registries, so config validation and the math agree."""

from async_rl import algorithms, config


def test_config_names_match_algorithm_registries():
    assert set(config.ADV_ESTIMATORS) == set(algorithms.ADV_ESTIMATORS)
    assert set(config.KL_KINDS) == set(algorithms.KL_KINDS)
    assert set(config.LOSS_AGG_MODES) == set(algorithms.LOSS_AGG_MODES)
    assert set(config.POLICY_LOSS_MODES) == set(algorithms.POLICY_LOSSES)
    assert set(config.CRITIC_ESTIMATORS) == set(algorithms.CRITIC_ESTIMATORS)
    for name in algorithms.ADV_ESTIMATORS:
        assert config.needs_critic(name) == algorithms.needs_critic(name)
