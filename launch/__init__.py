"""The commands as files. Each runs as a file or as a module from the repository root, with the same flags:

    python launch/train.py --config=configs/demo_cpu.py        python -m launch.train --config=configs/demo_cpu.py

``launch/<name>.py`` for train, eval, export_hf, pretrain, aot_compile, paired_stats, serve: each runs the ``cli()`` of
``envace_jax/cli/<name>.py``, as the console script ``envace-<name>`` does. ``launch/demo.py`` (``make demo``;
its default config is the repository's configs/demo.py) and the cluster scripts ``launch/gpu/<name>.py`` and
``launch/tpu_vm/<name>.py`` (create, setup, run) hold their own mains: run as a file, a cluster script's folder
is first on sys.path and it imports its helper (``hosts``, ``_common``) as a top-level module; run as a module,
relative to its package. No script edits sys.path.
"""
