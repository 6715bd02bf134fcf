"""TRL's GRPO iteration for ``benchmarks/peers.py``: ``python trl_grpo.py SPEC.json`` in TRL's venv.

The API is ``trl.GRPOTrainer`` with a custom reward function, trained for ``warmup + iters`` optimizer
steps on the spec's prompts. The model is ``transformers.AutoModelForCausalLM.from_pretrained`` on the
exported folder, float32, default attention (``sdpa``). Configuration (``GRPOConfig``), TRL's defaults
for CPU where they matter for speed: ``use_vllm=False`` (transformers ``generate``; vLLM needs a GPU),
``use_cpu=True``, no bf16/fp16 (float32 like the others), no gradient checkpointing,
``dataloader_num_workers=0``, ``report_to="none"``, no saving, torch on ``threads`` intra-op threads
(``torch.set_num_threads``). One generation batch per optimizer step: ``per_device_train_batch_size =
rows``, ``num_generations = G``, ``gradient_accumulation_steps=1``, ``num_iterations=1``, ``beta=0.0``
(no reference model), ``epsilon=clip_eps``, ``loss_type="grpo"`` (sequence mean of token means, as ours),
``scale_rewards="group"``, ``temperature=T, top_p=1.0, top_k=0``, ``max_completion_length=new_tokens``;
AdamW (``optim="adamw_torch"``) with the spec's numbers, ``max_grad_norm=grad_clip``, a constant
learning rate without warm-up.

Prompts go in as text through a word-level tokenizer whose tokens are the ids themselves, so TRL
tokenizes each prompt to exactly the spec's ids; eos and pad are ids past the model's vocabulary, which
it cannot produce, so every completion runs to ``new_tokens``.

Timing: one iteration is one optimizer step, from the trainer callback's ``on_step_begin`` to its
``on_step_end`` (generation, reward, advantages, the loss's forward and backward, the AdamW step);
sampling is ``GRPOTrainer._generate`` inside it.
"""

from __future__ import annotations

import time

import peer_common as pc

SPEC = pc.read_spec(pc.spec_path_from_argv())
pc.limit_threads(int(SPEC["threads"]))

import os  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402

torch.set_num_threads(int(SPEC["threads"]))

import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback  # noqa: E402


def id_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: the word ``"17"`` is token 17; eos and pad are the two ids after the vocabulary."""
    vocab = {str(i): i for i in range(vocab_size)}
    vocab["<eos>"], vocab["<pad>"] = vocab_size, vocab_size + 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", padding_side="left")


def main():
    spec = SPEC
    G, N = int(spec["group_size"]), int(spec["new_tokens"])
    rows = len(spec["prompts"]) * G
    steps = int(spec["warmup"]) + int(spec["iters"])
    torch.manual_seed(int(spec["seed"]))
    tok = id_tokenizer(int(spec["model"]["vocab_size"]))
    for p in spec["prompts"]:
        if tok(pc.text_from_ids(p))["input_ids"] != list(p):
            raise RuntimeError("trl: the id tokenizer does not give back the spec's prompt ids")
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    a = spec["adamw"]
    rewards: list[float] = []
    clock = pc.IterationClock()

    def even_share(prompts, completions, completion_ids, **kw):
        if any(len(c) != N for c in completion_ids):
            raise RuntimeError(f"trl: completion lengths {sorted({len(c) for c in completion_ids})}, expected {N}")
        scores = [pc.reward(c) for c in completion_ids]
        rewards.append(sum(scores) / len(scores))
        return scores

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            clock.begin()

        def on_step_end(self, args, state, control, **kw):
            clock.end()

    with tempfile.TemporaryDirectory() as out_dir:
        args = trl.GRPOConfig(
            output_dir=out_dir,
            use_cpu=True,
            use_vllm=False,
            bf16=False,
            fp16=False,
            gradient_checkpointing=False,
            dataloader_num_workers=0,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            max_steps=steps,
            per_device_train_batch_size=rows,
            gradient_accumulation_steps=1,
            num_generations=G,
            num_iterations=1,
            max_completion_length=N,
            temperature=float(spec["temperature"]),
            top_p=1.0,
            top_k=0,
            beta=0.0,
            epsilon=float(spec["clip_eps"]),
            loss_type="grpo",
            scale_rewards="group",
            shuffle_dataset=False,
            learning_rate=float(spec["lr"]),
            lr_scheduler_type="constant",
            warmup_steps=0,
            optim="adamw_torch",
            adam_beta1=a["b1"],
            adam_beta2=a["b2"],
            adam_epsilon=a["eps"],
            weight_decay=a["weight_decay"],
            max_grad_norm=a["grad_clip"],
            seed=int(spec["seed"]),
        )
        data = Dataset.from_dict({"prompt": [pc.text_from_ids(p) for p in spec["prompts"]]})
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=even_share,
            args=args,
            train_dataset=data,
            processing_class=tok,
            callbacks=[StepClock()],
        )
        inner = trainer._generate

        def timed_generate(*a_, **k_):
            t0 = time.perf_counter()
            out = inner(*a_, **k_)
            clock.sampling(time.perf_counter() - t0)
            return out

        trainer._generate = timed_generate
        trainer.train()
    api = (
        "trl.GRPOTrainer(reward_funcs=[custom], GRPOConfig(use_vllm=False, use_cpu=True, num_generations=G, "
        "num_iterations=1, beta=0, loss_type='grpo', optim='adamw_torch')).train(); generation by transformers "
        f"generate, {torch.get_num_threads()} torch threads"
    )
    versions = {
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    pc.emit(pc.result(spec, clock, rewards, api, versions))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
