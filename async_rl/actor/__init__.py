"""The vLLM actor: continuous generation, behaviour log-probs, rewards, and in-flight weight updates."""
