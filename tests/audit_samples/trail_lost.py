"""Where the audit cannot follow the buffer: it must say so (low), never drop the zero fill silently;
and the collectives whose semantics are known."""
import torch
import torch.distributed as dist
from torch.utils.dlpack import from_dlpack


def through_dlpack(x, ext):
    out = torch.zeros_like(x)
    arr = from_dlpack(out)
    ext.fill(arr, x)
    return out


def through_dunder_dlpack(x, ext):
    out = torch.zeros_like(x)
    ext.write(out.__dlpack__(), x)
    return out


class Runner:
    def __init__(self, model):
        self.step = torch.compile(model)

    def run(self, x):
        out = torch.zeros_like(x)
        self.step(x, out)
        return out

    def run_module(self, x):
        out = torch.zeros_like(x)
        self.head(x, out)
        return out


def gather(x, world):
    out = torch.zeros(world * x.shape[0], x.shape[1], dtype=x.dtype)
    dist.all_gather_into_tensor(out, x)
    return out


def scatter_reduce(x, world):
    out = torch.zeros(x.shape[0] // world, x.shape[1], dtype=x.dtype)
    dist.reduce_scatter_tensor(out, x)
    return out


def reduce_in_place(x):
    buf = torch.zeros_like(x)
    dist.all_reduce(buf)
    return buf


def broadcast_from_zero(x):
    buf = torch.zeros_like(x)
    dist.broadcast(buf, src=0)
    return buf


def raw_pointer(x, lib):
    out = torch.zeros_like(x)
    lib.launch(x.data_ptr(), out.data_ptr(), x.numel())
    return out


def pointer_array(xs, lib):
    out = torch.zeros_like(xs[0])
    lib.launch(ptrs=[x.data_ptr() for x in xs] + [out.data_ptr()])
    return out


def broadcast_view(x):
    out = torch.zeros(1, x.shape[1])
    y = torch.broadcast_to(out, x.shape) + x
    return y


def _fill(x, out):
    out.copy_(x)


class CompiledFill:
    def __init__(self):
        self.fill = torch.compile(_fill)

    def run(self, x):
        out = torch.zeros_like(x)
        self.fill(x, out)
        return out
