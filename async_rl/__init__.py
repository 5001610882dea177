"""async_rl: asynchronous actor-learner RL fine-tuning of LLMs.

vLLM actors generate continuously and stream rollout groups over ZeroMQ (msgpack) to an FSDP2 learner group launched
with torchrun; the learner trains with off-policy-corrected PPO/GRPO updates and broadcasts new weights back to the
actors, keeping every trained sample within a staleness bound.

Subpackages, one per concern:
    algorithms   pure tensor math: advantage estimators, policy/value losses, KL penalties (no torch.distributed)
    config       the typed config tree (verl-compatible keys), YAML loading, dotted overrides, validation (no torch)
    transport    the rollout plane: wire protocol, coordinator with exactly-once ledger, staleness bound
    actor        the vLLM actor process
    learner      the FSDP2 learner group
    weight_sync  learner -> actor weight broadcast (NCCL on GPU, gloo on CPU) with digest verification
    models       tiny models and tokenizers built in code (tests, demo)
    rewards      reward functions
    entrypoints  thin command-line entry points
"""

__version__ = "0.1.0"
