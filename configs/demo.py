"""The embedded demo (``make demo``): every field of ``envace_jax/demo/config.py``'s ``DemoConfig``.

python launch/demo.py --run_dir=runs/demo                                  # this file, default preset
python launch/demo.py --config=configs/demo.py:reduced --run_dir=/tmp/ci   # the minutes-long CI preset
python launch/demo.py --config.eval_split=validation --config.rl_steps=10  # any field
"""

from envace_jax.demo.config import demo_config_dict


def get_config(preset: str = "default"):
    return demo_config_dict(preset)
