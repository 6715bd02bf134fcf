"""The command-line programs. Each runs as a file or as a module from the repository root, with the same flags:

    python launch/train.py --config=configs/demo_cpu.py        python -m launch.train --config=configs/demo_cpu.py

``launch/<name>.py`` for train, eval, export_hf, pretrain, demo, aot_compile, and ``launch/gpu/<name>.py`` and
``launch/tpu_vm/<name>.py`` for create, setup, run. Run as a file, a script's own folder is first on sys.path
and it imports its helpers (``entrypoint``, ``hosts``, ``_common``) as top-level modules; run as a module, it
imports them relative to this package. No script edits sys.path.
"""
