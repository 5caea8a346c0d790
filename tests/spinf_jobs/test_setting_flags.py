"""The command line's engine flags are the settings' fields: the same name, default, checks and
meaning, with the SPINF_* variable as the default a flag overrides."""

import os

import pytest

from contract.settings import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MODEL,
    Settings,
    get_settings,
)
from spinf_jobs.cli import build_parser
from spinf_jobs.service_commands import DEMO_MAX_NUM_BATCHED_TOKENS
from spinf_jobs.setting_flags import settings_from_args


@pytest.fixture
def env(monkeypatch):
    """env(**variables): set SPINF_* variables for get_settings (re-read after each call)."""
    for name in [n for n in os.environ if n.startswith("SPINF_")]:
        monkeypatch.delenv(name)

    def set_env(**variables):
        for name, value in variables.items():
            monkeypatch.setenv(f"SPINF_{name.upper()}", value)
        get_settings.cache_clear()

    set_env()
    yield set_env
    get_settings.cache_clear()


def _settings(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(list(argv)))


@pytest.mark.parametrize("command", ["score", "worker", "serve", "demo"])
def test_a_flag_left_out_keeps_the_variable_else_the_default(env, command):
    extra = ["-"] if command == "score" else []
    default = _settings(command, *extra)
    if command == "demo":  # smaller passes on purpose: its progress bar moves pass by pass
        assert default.max_num_batched_tokens == DEMO_MAX_NUM_BATCHED_TOKENS
    else:
        assert default.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS == 16384
    assert default.device == "auto" and default.default_model == DEFAULT_MODEL
    env(device="cpu", max_num_batched_tokens="512", pack_dirs='["/srv/packs"]')
    from_env = _settings(command, *extra)
    assert from_env.device == "cpu" and [str(p) for p in from_env.pack_dirs] == ["/srv/packs"]
    if command != "demo":
        assert from_env.max_num_batched_tokens == 512
    flagged = _settings(command, *extra, "--device", "cuda", "--max-num-batched-tokens", "1024")
    assert flagged.device == "cuda" and flagged.max_num_batched_tokens == 1024


def test_a_list_flag_adds_to_the_variable(env):
    env(pack_dirs='["/srv/packs"]')
    settings = _settings("worker", "--packs", "/a", "--packs", "/b")
    assert [str(p) for p in settings.pack_dirs] == ["/srv/packs", "/a", "/b"]
    assert [str(p) for p in _settings("calibrate", "--pack", "x", "--data", "d.jsonl", "--packs", "/c").pack_dirs] \
        == ["/srv/packs", "/c"]


def test_score_and_parity_model_flag_is_the_default_model(env):
    assert _settings("score", "-", "--model", "smollm2-135m-instruct").default_model == "smollm2-135m-instruct"
    assert _settings("parity").default_model == DEFAULT_MODEL
    env(default_model="gemma-3-270m")
    assert _settings("parity").default_model == "gemma-3-270m"


@pytest.mark.parametrize(("argv", "message"), [
    (["worker", "--max-num-batched-tokens", "0"], "argument --max-num-batched-tokens: Input should be greater than 0"),
    (["serve", "--device", "gpu"], "argument --device: Value error, 'gpu' is not one of auto, cpu, cuda, cuda:N"),
    (["score", "-", "--max-num-batched-tokens", "many"], "unable to parse string as an integer"),
])
def test_a_bad_flag_is_refused_with_the_fields_message(env, capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_help_names_the_variable_and_the_default(env, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "tokens per forward pass (default: SPINF_MAX_NUM_BATCHED_TOKENS, else 16384)" in text
    assert "(repeatable, adds to SPINF_PACK_DIRS)" in text
