"""Stands in for moai.train in a real `accelerate launch`: rank 1 fails after a second, rank 0 would run on."""

import time

import torch.distributed as dist

from moai.train import guarded


def body():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(1)
        raise ValueError("rank one broke on purpose")
    time.sleep(120)


if __name__ == "__main__":
    guarded(body)
