"""The vLLM side of ``rollout.engine="vllm"``: a process that owns one vLLM ``LLM`` and answers the rollout
client (``rl.vllm_engine``) over a local socket.

It runs in vLLM's own interpreter (``make vllm-deps`` builds one in ``.cache/vllm``), so it imports nothing of
envace_jax, and no jax: the standard library, numpy, torch and vllm only. It is started as a script:

    python -c "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')" .../vllm_worker.py

with the socket's address in ENVACE_VLLM_ADDRESS and its authentication key in ENVACE_VLLM_AUTHKEY (hex). (Run
by path, this file's folder would come first on ``sys.path``, and ``rl/types.py`` would hide the standard
library's ``types``.)

Messages are dicts (``op`` plus fields), answered in order with a dict that has ``error`` on failure:

* ``start``: ``config`` (a Qwen3 config.json dict), ``dtype``, ``max_model_len``, ``seed``, ``enforce_eager``,
  ``max_num_seqs``. The engine loads no weights from disk (``load_format="dummy"``): the trainer's weights
  arrive with the first ``load_weights``. The KV cache's size comes from vLLM's own settings
  (``VLLM_CPU_KVCACHE_SPACE`` on CPU, ``gpu_memory_utilization`` on GPU).
* ``generate``: ``prompts`` (lists of token ids) and ``params`` (one dict per prompt); one ``LLM.generate``
  call for all of them. Each answer: ``ids`` (a stop token included), ``logprobs`` (the sampled tokens', at
  the row's temperature over the whole vocabulary when top-k and top-p are off), ``finish`` and ``cached``
  (prompt tokens vLLM's prefix cache already held).
* ``load_weights``: ``shm`` (a shared-memory block's name), ``manifest`` (name, dtype, shape, offset of each
  tensor in Hugging Face's layout) and ``tied`` (the output head shares the embedding). The tensors are read in
  place from the block and loaded with vLLM's in-place reload (``reload_weights``, which re-packs the CPU
  kernels' weights; a tied head is re-packed here, ``_retie_head``); then the prefix cache is emptied, since
  its keys and values came from the old weights.
* ``shutdown``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import traceback

# The engine runs in this process (no engine-core child): weights loaded here are the weights it samples with.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _engine(msg: dict, model_dir: str):
    from vllm import LLM

    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(msg["config"], f)
    return LLM(
        model=model_dir,
        load_format="dummy",  # the trainer's weights come with load_weights, never from a file
        skip_tokenizer_init=True,  # token ids in and out: the client owns the tokenizer
        dtype=msg["dtype"],
        seed=int(msg["seed"]),
        max_model_len=int(msg["max_model_len"]),
        enforce_eager=bool(msg["enforce_eager"]),
        enable_prefix_caching=True,  # a turn's prompt extends the previous one's: its blocks are reused
        max_num_seqs=int(msg["max_num_seqs"]),
        # log-probs at the row's temperature (the trainer's convention), not of the raw logits
        logprobs_mode="processed_logprobs",
    )


def _sampling(p: dict):
    from vllm import SamplingParams

    return SamplingParams(
        temperature=float(p["temperature"]),
        top_p=float(p["top_p"]),
        top_k=int(p["top_k"]) if int(p["top_k"]) > 0 else -1,
        max_tokens=int(p["max_tokens"]),
        seed=None if p.get("seed") is None else int(p["seed"]),
        stop_token_ids=list(p["stop_token_ids"]),
        ignore_eos=True,  # only the client's stop ids end a row, as in the native sampler
        logprobs=0,  # the sampled token's log-prob only
        detokenize=False,
    )


def _generate(llm, msg: dict) -> dict:
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in msg["prompts"]]
    outs = llm.generate(prompts, [_sampling(p) for p in msg["params"]], use_tqdm=False)
    rows = []
    for o in outs:
        c = o.outputs[0]
        # with logprobs=0 each position's dict holds the sampled token's entry
        lps = [float((d.get(t) or next(iter(d.values()))).logprob) for d, t in zip(c.logprobs or [], c.token_ids)]
        rows.append(
            {
                "ids": [int(t) for t in c.token_ids],
                "logprobs": lps,
                "finish": str(c.finish_reason or "length"),
                "cached": int(getattr(o, "num_cached_tokens", 0) or 0),
            }
        )
    return {"rows": rows}


def _retie_head(model) -> None:
    """With tied embeddings the output head reads the embedding's table, but on CPU it computes from a packed copy
    made when the model was built (``dispatch_cpu_unquantized_gemm``), and the in-place reload refreshes only the
    embedding (the head has no tensor of its own in the checkpoint). So the head is pointed at the new table and
    its copy packed again; without this it would keep sampling from the dummy weights."""
    head, table = model.lm_head, model.model.embed_tokens
    head.weight = table.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)


def _load_weights(llm, msg: dict) -> dict:
    import torch
    from multiprocessing import resource_tracker, shared_memory

    t0 = time.perf_counter()
    shm = shared_memory.SharedMemory(name=msg["shm"])
    # The client owns the block: this process must not unlink it when it exits (no public switch before 3.13).
    resource_tracker.unregister(shm._name, "shared_memory")
    try:

        def tensors():
            for name, dtype, shape, offset in msg["manifest"]:
                dt = getattr(torch, dtype)
                count = 1
                for s in shape:
                    count *= int(s)
                yield name, torch.frombuffer(shm.buf, dtype=dt, count=count, offset=int(offset)).view(*shape)

        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors()})
        if msg.get("tied"):
            llm.apply_model(_retie_head)
        llm.reset_prefix_cache()
    finally:
        shm.close()
    return {"seconds": time.perf_counter() - t0}


def serve(address: str, authkey: bytes) -> None:
    from multiprocessing.connection import Client

    conn = Client(address, authkey=authkey)
    model_dir = tempfile.mkdtemp(prefix="envace_vllm_")  # config.json only
    try:
        _loop(conn, model_dir)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


def _loop(conn, model_dir: str) -> None:
    llm = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the client went away
            return
        op = msg.get("op")
        try:
            if op == "start":
                import vllm

                t0 = time.perf_counter()
                llm = _engine(msg, model_dir)
                reply = {"seconds": time.perf_counter() - t0, "vllm": vllm.__version__}
            elif op == "shutdown":
                conn.send({"ok": True})
                return
            elif llm is None:
                reply = {"error": f"op {op!r} before start"}
            elif op == "generate":
                reply = _generate(llm, msg)
            elif op == "load_weights":
                reply = _load_weights(llm, msg)
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as e:  # reported to the client, which raises it with this traceback
            reply = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        conn.send(reply)


if __name__ == "__main__":
    serve(os.environ["ENVACE_VLLM_ADDRESS"], bytes.fromhex(os.environ["ENVACE_VLLM_AUTHKEY"]))
