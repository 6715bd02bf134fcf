"""The choices of the config's enumerated knobs, each listed beside the knob it belongs to."""

MODES = ("rehearsal", "simulator", "real", "noshare", "caller_frozen")  # rollout.mode (rl/rollout.py)
BASELINES = ("row_mean", "trajectory_mean", "rloo", "none")  # rl.baseline (rl/advantages.py)
# loss.agg (rl/loss.py); seq_mean_token_sum_norm is Dr. GRPO's constant normaliser (loss.agg_norm)
AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
KL_TYPES = ("k1", "k2", "k3")  # loss.kl_type (rl/loss.py)
RATIO_LEVELS = ("token", "sequence", "sequence_token")  # loss.ratio_level (rl/ratio_levels.py)
TOOL_CALL_SYNTAXES = ("qwen3", "reference")  # rollout.tool_call_syntax (chat/tool_parser)
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
# rl.behaviour_is: the off-policy correction of the update (rl/loss.py behaviour_weights); "auto" resolves by
# RLSection.behaviour_correction
BEHAVIOUR_IS = ("auto", "none", "token", "sequence")
JUDGE_STREAMING = ("auto", "on", "off")  # rollout.judge_streaming (rl/judge_stream.py)
ROLLOUT_ENGINES = ("native", "vllm")  # rollout.engine: our Sampler, or a vLLM engine (rl/vllm_engine.py)
VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")  # rollout.vllm.dtype ("auto": the model's compute dtype)
# model.preset: "tiny" (sizes from the model section) or a Qwen3Config preset of the same name
MODEL_PRESETS = ("tiny", "qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_4b_2507", "qwen3_8b", "qwen3_14b", "qwen3_32b")
# ... and the Qwen3-MoE presets (a Qwen3MoeConfig preset of the same name, models/qwen3_moe_config.py)
MOE_PRESETS = ("qwen3_30b_a3b", "qwen3_235b_a22b")
MOE_DISPATCHES = ("auto", "dense", "ragged", "blocked", "megablox")  # model.moe_dispatch (models/moe.py)
SCHEDULES = ("constant", "cosine", "linear")  # optim.schedule: learning-rate schedules after warmup (rl/optim.py)
