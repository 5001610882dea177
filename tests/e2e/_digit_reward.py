"""A dense reward for e2e runs of the untrained tiny model (verl's custom_reward_function signature): the share of
digits in the completion. Random completions differ in it, so GRPO advantages are never all zero."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))
