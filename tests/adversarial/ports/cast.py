"""Correct ports in lower precision: a cast copy of the reference (must PASS)."""

import copy

import torch


def bfloat16(reference):
    return copy.deepcopy(reference.model).to(torch.bfloat16).eval()


def float16(reference):
    return copy.deepcopy(reference.model).to(torch.float16).eval()
