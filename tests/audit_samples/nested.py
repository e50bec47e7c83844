"""A nested function's finding reported once; a buffer a nested function reads is not overwritten."""
import torch


def outer(x):
    total = torch.zeros(())

    def inner(y):
        out = torch.zeros_like(y)
        out.copy_(y)
        return out

    total += inner(x).sum()
    return total


def captured(x, steps):
    state = torch.zeros_like(x)

    def step():
        return state + x

    for _ in range(steps):
        step()
        state.copy_(x)
    return state


def grid_lambda_only_reads_shape(x):
    out = torch.zeros_like(x)
    grid = lambda meta: (out.shape[0],)  # noqa: E731
    out.copy_(x)
    return out, grid
