"""An exact-match reward that takes 50 ms a sample (verl's custom_reward_function signature): it paces a
rejection-sampling job of the tiny model so a test can kill it mid-run."""

import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(0.05)
    return 1.0 if solution_str.strip() == ground_truth else 0.0
