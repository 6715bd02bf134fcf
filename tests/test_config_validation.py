"""Config files load into validated dataclasses; bad fields give errors naming them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from envace_jax.config import (
    MODEL_PRESETS,
    ConfigError,
    ModelSection,
    OptimConfig,
    RoleSampling,
    check_runnable,
    config_from_file,
    load_config,
    to_config_dict,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ["demo_cpu", "envace_qwen3_8b", "ablation_real_env", "ablation_frozen_simulator", "ablation_noshare"]


def _cfg(name):
    return config_from_file(os.path.join(ROOT, "configs", f"{name}.py"))


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_file_loads_without_losing_a_value(name):
    written = _cfg(name)
    # every field the file holds arrives in the dataclasses unchanged (and nothing is added)
    assert to_config_dict(load_config(written)).to_dict() == written.to_dict()


def test_reading_a_config_file_loads_neither_jax_nor_the_rl_code():
    code = (
        "import sys; from envace_jax.config import config_from_file, load_config; "
        f"load_config(config_from_file({os.path.join(ROOT, 'configs', 'envace_qwen3_8b.py')!r})); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax') "
        "or m.startswith('envace_jax.rl')); print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_one_validation_path_in_code_and_from_a_file():
    # The dataclass checks its own range when built in code; loading only adds the dotted field name.
    with pytest.raises(ConfigError, match=r"^optim\.lr must be > 0, got -1\.0$"):
        OptimConfig(lr=-1.0)
    with pytest.raises(ConfigError, match=r"^sampling\.top_p must be in \(0, 1\], got 0\.0$"):
        RoleSampling(top_p=0.0)
    c = _cfg("demo_cpu")
    c.rollout.rehearse.top_p = 0.0
    with pytest.raises(ConfigError, match=r"^config\.rollout\.rehearse\.top_p must be in \(0, 1\], got 0\.0$"):
        load_config(c)


def test_the_schedule_length_follows_total_steps_unless_set():
    c = _cfg("demo_cpu")
    assert load_config(c).run_optim().total_steps == 20  # one optimizer step per iteration
    c.rl.ppo_epochs, c.rl.mini_batches = 2, 3
    assert load_config(c).run_optim().total_steps == 20 * 2 * 3
    c.optim.total_steps = 7  # set explicitly: used as written
    assert load_config(c).run_optim().total_steps == 7
    assert load_config(_cfg("envace_qwen3_8b")).run_optim().total_steps == 470
    with pytest.raises(ValueError, match="optim.total_steps"):  # a decaying schedule needs a length
        from envace_jax.rl.trainer import make_schedule

        make_schedule(OptimConfig(schedule="cosine"))


def test_model_preset_selects_the_architecture():
    from envace_jax.models import qwen3
    from envace_jax.rl.train import model_config

    for name in MODEL_PRESETS[1:]:
        assert callable(getattr(qwen3.Qwen3Config, name)), name
    big = model_config(ModelSection(preset="qwen3_8b", dtype="bfloat16"), vocab=480)
    assert big == qwen3.Qwen3Config.qwen3_8b(param_dtype="float32", dtype="bfloat16")
    tiny = model_config(ModelSection(hidden_size=32, num_layers=3, vocab_size=100), vocab=480)
    assert (tiny.hidden_size, tiny.num_layers, tiny.vocab_size) == (32, 3, 480)
    with pytest.raises(ConfigError, match=r"model\.preset must be one of"):
        ModelSection(preset="qwen9")


def test_reference_hyperparameters():
    c = load_config(_cfg("envace_qwen3_8b"))
    # prompts_per_step is per process: 1 on each of v5p-64's 16 hosts is the reference's batch of 16.
    assert (c.data.prompts_per_step * 16, c.rl.n_rollouts) == (16, 4)
    assert (c.optim.lr, c.optim.schedule, c.optim.b1, c.optim.b2, c.optim.weight_decay, c.optim.grad_clip) == (
        1e-6,
        "constant",
        0.9,
        0.999,
        0.01,
        1.0,
    )
    assert (c.loss.clip_low, c.loss.clip_high, c.loss.dual_clip) == (0.2, 0.2, 3.0)
    assert (c.loss.kl_coef, c.loss.kl_type, c.loss.entropy_coef, c.loss.agg) == (0.0, "k3", 0.0, "seq_mean_token_mean")
    assert (c.rollout.act.temperature, c.rollout.act.top_p) == (1.0, 1.0)
    assert c.rollout.act.max_new_tokens == c.rollout.rehearse.max_new_tokens == 8000
    assert (c.rollout.max_model_len, c.rollout.max_assistant_turns, c.rollout.max_user_turns, c.rollout.max_steps) == (
        20000,
        30,
        30,
        200,
    )
    assert (
        c.judge.kind,
        c.judge.http.model,
        c.judge.http.temperature,
        c.judge.http.top_p,
        c.judge.http.max_tokens,
        c.judge.http.max_attempts,
        c.judge.http.timeout_s,
    ) == ("http", "Qwen/Qwen3-30B-A3B", 0.6, 0.8, 6000, 5, 120.0)
    assert (c.model.param_dtype, c.model.dtype) == ("float32", "bfloat16")
    assert c.tokenizer.enable_thinking and c.tokenizer.simulator_thinking
    assert (c.rl.baseline, c.rl.normalize_std, c.rl.empty_output_penalty) == ("row_mean", False, 0.1)
    modes = {n: load_config(_cfg(n)).rollout.mode for n in CONFIGS[2:]}
    assert modes == {
        "ablation_real_env": "real",
        "ablation_frozen_simulator": "simulator",
        "ablation_noshare": "noshare",
    }


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("optim.lr", "fast", "config.optim.lr must be a number"),
        ("rl.n_rollouts", 2.5, "config.rl.n_rollouts must be an int"),
        ("rl.n_rollouts", True, "config.rl.n_rollouts must be an int"),
        ("tokenizer.enable_thinking", "yes", "config.tokenizer.enable_thinking must be a bool"),
        ("rollout.act.temperature", None, "config.rollout.act.temperature must be a number"),
        ("data.path", 3, "config.data.path must be a string"),
    ],
)
def test_wrong_type_names_the_field(field, value, needle):
    c = _cfg("demo_cpu").to_dict()
    section, *rest = field.split(".")
    d = c
    for part in [section] + rest[:-1]:
        d = d[part]
    d[rest[-1]] = value
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(c)


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("optim.lr", -1e-3, "config.optim.lr must be > 0"),
        ("optim.b2", 1.0, "config.optim.b2 must be in [0, 1)"),
        ("loss.clip_low", 1.5, "config.loss.clip_low must be in [0, 1)"),
        ("loss.dual_clip", 0.5, "config.loss.dual_clip must be > 1 or None"),
        ("rollout.act.top_p", 0.0, "config.rollout.act.top_p"),
        ("rollout.mode", "dream", "config.rollout"),
        ("rl.baseline", "median", "config.rl.baseline must be one of"),
        ("data.prompts_per_step", 0, "config.data.prompts_per_step must be > 0"),
        ("checkpoint.every", 0, "config.checkpoint.every must be > 0"),
        # log-probs are taken at the sampling temperature: greedy training rollouts would divide by zero
        ("rollout.act.temperature", 0.0, "config.rollout.act.temperature must be > 0 for training"),
        ("rollout.rehearse.temperature", 0.0, "config.rollout.rehearse.temperature must be > 0 for training"),
    ],
)
def test_out_of_range_names_the_field(field, value, needle):
    c = _cfg("demo_cpu")
    with c.ignore_type():
        section, *rest = field.split(".")
        d = c
        for part in [section] + rest[:-1]:
            d = d[part]
        d[rest[-1]] = value
    with pytest.raises(ConfigError) as e:
        load_config(c)
    assert needle in str(e.value)


def test_unknown_field_and_missing_paths():
    c = _cfg("demo_cpu").to_dict()
    c["optim"]["learning_rate"] = 1.0
    with pytest.raises(ConfigError, match=r"config\.optim has unknown field\(s\) \['learning_rate'\]"):
        load_config(c)
    with pytest.raises(ConfigError, match=r"config\.data\.path is required"):
        check_runnable(load_config(_cfg("envace_qwen3_8b")))
    c8 = _cfg("envace_qwen3_8b")
    c8.data.path = "/data/x.jsonl"
    with pytest.raises(ConfigError, match=r"config\.model\.hf_path is required"):
        check_runnable(load_config(c8))


def test_command_line_override_out_of_range_is_reported_by_train_py():
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "train.py"),
            f"--config={ROOT}/configs/demo_cpu.py",
            "--config.optim.lr=-0.5",
            "--config.run_dir=/nonexistent/x",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        timeout=300,
    )
    assert r.returncode == 2
    assert "config.optim.lr must be > 0, got -0.5" in r.stderr


@pytest.mark.parametrize("baseline", ["row_mean", "trajectory_mean", "rloo"])
def test_a_group_of_one_rollout_is_refused_for_grpo(baseline):
    c = _cfg("demo_cpu")
    c.rl.baseline, c.rl.n_rollouts = baseline, 1
    with pytest.raises(
        ConfigError,
        match=rf"^config\.rl\.n_rollouts must be >= 2 with rl\.baseline='{baseline}', "
        r"got 1: a group of one rollout has no group-relative advantage",
    ):
        load_config(c)
    c.rl.n_rollouts = 2
    assert load_config(c).rl.n_rollouts == 2
    c.rl.baseline, c.rl.n_rollouts = "none", 1  # raw scores, no baseline: one rollout is meaningful
    assert load_config(c).rl.n_rollouts == 1


@pytest.mark.parametrize(
    "given,fix,needle",
    [
        (
            {"data.path": "/data/cm2.jsonl"},
            {"data.source": "jsonl"},
            "config.data.path='/data/cm2.jsonl' is never read with config.data.source='demo'",
        ),
        (
            {"model.simulator_hf_path": "/ckpt/sim"},
            {"rollout.mode": "simulator"},
            "config.model.simulator_hf_path='/ckpt/sim' is read only by rollout.mode 'simulator' or 'noshare', "
            "but config.rollout.mode='rehearsal'",
        ),
        (
            {"rollout.rolling_eager_refill": True},
            {"rollout.rolling": True},
            "config.rollout.rolling_eager_refill=True acts only with config.rollout.rolling=True",
        ),
    ],
)
def test_a_setting_its_context_ignores_is_an_error_naming_both_fields(given, fix, needle):
    def apply(c, kv):
        for k, v in kv.items():
            *head, last = k.split(".")
            node = c
            for part in head:
                node = node[part]
            node[last] = v

    c = _cfg("demo_cpu")
    apply(c, given)
    with pytest.raises(ConfigError) as e:
        load_config(c)
    assert str(e.value).startswith(needle)
    apply(c, fix)  # in the context that reads it, the same setting loads
    load_config(c)


def test_an_unknown_field_in_a_config_file_names_the_nearest():
    c = _cfg("demo_cpu").to_dict()
    c["optim"]["lrr"] = 1.0
    with pytest.raises(
        ConfigError,
        match=r"^config\.optim has unknown field\(s\) \['lrr'\]; did you mean "
        r"config\.optim\.lr for 'lrr'\? known: \[",
    ):
        load_config(c)
