"""The commands' mains: ``envace-train`` (train.py), ``envace-eval`` (eval.py), ``envace-export-hf``
(export_hf.py), ``envace-pretrain`` (pretrain.py) and ``envace-aot-compile`` (aot_compile.py), declared in
pyproject.toml's [project.scripts]; ``launch/<name>.py`` and ``python -m launch.<name>`` run the same ``cli()``.
``entrypoint`` is what they share: short messages for expected failures, the package's log on stderr.

Nothing is imported here: each main defines its absl flags when its module is imported, so one process
imports one main.
"""
