"""An OpenAI-compatible chat-completions server over our sampler and a Hugging Face checkpoint.

    python launch/serve.py --model /ckpt/Qwen3-8B --port 8000 --max-model-len 8192
    envace-serve --model /tmp/run/hf --served-model-name policy --api-key-env SERVE_KEY

Then any OpenAI client talks to http://HOST:PORT/v1 (tools, n, temperature, top-p, max tokens, stop,
response_format, streams); tool calls come back parsed as vLLM's hermes parser returns them. A training run can
use it as its HTTP judge (``--config.judge.kind=http --config.judge.http.base_url=http://127.0.0.1:8000``).
"""

from __future__ import annotations

import argparse
import os
import sys


def cli(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face checkpoint directory (dense Qwen3 or Qwen3-MoE)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the checkpoint's)")
    ap.add_argument("--served-model-name", default=None, help="the model id clients send (default: folder name)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--max-model-len", type=int, default=8192, help="prompt plus completion tokens per row")
    ap.add_argument("--max-rows", type=int, default=32, help="rows (choices) sampled together in one call")
    ap.add_argument("--api-key-env", default=None, help="environment variable holding the key clients must send")
    ap.add_argument("--no-thinking", action="store_true", help="render with enable_thinking=False by default")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    api_key = None
    if a.api_key_env:
        api_key = os.environ.get(a.api_key_env)
        if not api_key:
            ap.error(f"--api-key-env names {a.api_key_env!r}, which is not set")
    from envace_jax.serve import build_server

    server = build_server(
        a.model,
        model_name=a.served_model_name,
        tokenizer_path=a.tokenizer,
        dtype=a.dtype,
        max_model_len=a.max_model_len,
        max_rows=a.max_rows,
        host=a.host,
        port=a.port,
        api_key=api_key,
        enable_thinking=not a.no_thinking,
        seed=a.seed,
    )
    print(f"serving {server.model_name!r} at {server.url}/v1 (max_model_len {a.max_model_len})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(cli())
