"""Thin command-line entry points: parse the config first, import torch/vLLM only after it is valid."""
