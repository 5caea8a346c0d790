"""The engines of a process are built from its settings, and an engine built without settings
(benchmarks, tests, `Engine()`) has the settings' defaults."""

from contract.settings import Settings
from engine.engine import EngineConfig


def test_the_engine_defaults_are_the_settings_defaults():
    config, fields = EngineConfig(), Settings.model_fields
    assert config.model == fields["default_model"].default
    assert config.max_num_batched_tokens == fields["max_num_batched_tokens"].default
    assert config.device == fields["device"].default
    assert config.pack_dirs == tuple(fields["pack_dirs"].get_default(call_default_factory=True))
